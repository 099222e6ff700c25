"""The Aladdin scenario's split-phase arm: GPUs at P100 for the decode phase only (paper §6.4, Fig. 12).

The paper's setup (§6.4, "Split-Phase Inference"): "Previous work [Splitwise, DistServe, ...] split the
prefill phase and decode phase into different instances. Split-phase serving maintains a group of
prefill workers and a group of decode workers, as shown in Figure 5. According to the results of
DistServe, the majority of GPU resources are scheduled for the decode workers. Since the scheduling for
prefill instances is trivial with known prompt lengths, we only simulate the GPU number required for the
decode phase instance. The baselines are JSQ adopted by DistServe and the Power-of-Two algorithm adopted
by previous work. Results indicate that Aladdin reduces the GPU number required for the SLO-guaranteed
decode phase by up to 60% and 49% compared with JSQ and Power-of-Two algorithm." The workflow (§5.1,
Fig. 5): "the decoding scheduler places the requests from prefill workers to decoding workers based on
the predicted output length and a learned performance model"; the metric is §6.4's "GPU number required
for P100 SLO-guaranteed inference serving".

Ours: the default arm's models, SLOs, lengths, seeds, top rates, worker size N* and count rule (the
fewest n at which every seed meets P100 at n and at n + 1, ``Headline.fewest``), with one factor
changed: the workers are decode-only instances (``engine.decode_only``, ``llmfleet.sim.decode_only``).
Each request arrives at a decode worker at its Poisson arrival time with its prompt prefilled and its
first token sampled elsewhere (its prompt's KV lands with it; its first step there is a decode), so no
prefill runs on a decode worker and the SLO checked is the decode phase's, ATGT ≤ T_dec (TTFT is the
prefill workers' and 0 here). Requests of one output token have no decode phase and are left out. The
prefill workers and the KV transfer are not simulated, as in the paper. Configs, all counted the same
way on pools of exactly n workers: ``jsq-decode`` (join-shortest-queue), ``p2-decode`` (power of two
choices, seed 0) and Aladdin's best fit with the paper's constraints (``aladdin-fewest-decode``) and the
strict ones (``aladdin-strict-fewest-decode``), opening workers in order and sending a request none can
take to the least loaded once all are open, as in the default arm. Best fit prices the decode workers
with the cost source's decode iterations and no prefill (``costmodel.decode_worker``), as the simulator
charges them. The engines stay FCFS continuous batching.
"""

from __future__ import annotations

import time
from typing import Any

from llmfleet.workload import Workload

from . import common as C
from .aladdin_setup import MAX_GPUS, OPEN_PAPER, OPEN_STRICT
from .aladdin_sweep import Headline, Search

JSQ = "jsq-decode"
P2 = "p2-decode"
# (label, dispatch policy, Aladdin options) of the split-phase arm; the best-fit ones are counted as the
# default arm's ``*-fewest`` configs
SPLIT = (
    (JSQ, "jsq", None),
    (P2, "power_of_two", None),
    ("aladdin-fewest-decode", "aladdin_bestfit", OPEN_PAPER),
    ("aladdin-strict-fewest-decode", "aladdin_bestfit", OPEN_STRICT),
)


def decode_phase(wl: Workload) -> Workload:
    """The requests that reach a decode worker: those of more than one output token (the prefill
    worker's first token ends a one-token request)."""
    return Workload(tuple(r for r in wl.requests if r.output_tokens > 1))


def headline(model: str, mc: dict, tp: int, rate: float, wls: list, d: Any, log: C.Log) -> list[dict]:
    """P100 at ``rate`` on every seed's decode-phase workload, on decode-only workers of ``tp`` GPUs:
    the fewest workers of each :data:`SPLIT` config, each answer checked at n − 1 and n + 1."""
    t0 = time.perf_counter()
    dec = [decode_phase(w) for w in wls]

    def searches(policy: str, mode: dict | None) -> list[Search]:
        args = (model, tp, policy)
        return [
            Search(*args, w, mc["slo"], d.predict, d.pred, d.hw, mode, decode_only=True, stop_at_miss=True)
            for w in dec
        ]

    found: list[dict] = []
    jsq_n: int | None = None
    for label, policy, mode in SPLIT:
        head = Headline(label, searches(policy, mode))
        if mode is None:
            h = head.fewest(max(1, round(rate / 5)))
            jsq_n = h["workers"] if label == JSQ else jsq_n
        else:  # from the count best fit opens on a large pool up, every pool runs as that one
            pool = min(MAX_GPUS // tp, 2 * (jsq_n or 8) + 2)
            cap = max(s.eval(pool)["gpus_used"] // tp for s in head.searches) + 2
            h = head.fewest(jsq_n or 8, cap)
            # on the large pool: the workers it opened and the requests past T_dec, per seed
            h["pool_workers"] = pool
            h["pool_opened"] = [s.eval(pool)["gpus_used"] // tp for s in head.searches]
            h["pool_atgt_misses"] = [
                round(s.eval(pool)["viol_atgt"] * len(s.wl.requests)) for s in head.searches
            ]
        h.update(
            {
                "model": model,
                "rate_rps": rate,
                "arm": "split-phase decode",
                "requests": [len(w) for w in wls],
                "decode_requests": [len(w) for w in dec],
            }
        )
        found.append(h)
        log(f"  aladdin split {model} {rate:g} req/s {label:28s} TP{tp}: {h['workers']} workers per seed "
            f"{h['per_seed']}, P100 at n−1/n/n+1 {h.get('p100_below')}/{h.get('p100_at')}/{h.get('p100_above')}, "
            f"busy {h.get('busy_workers')}")  # fmt: skip
    log(f"  aladdin {model} split-phase TP{tp} [{time.perf_counter() - t0:.0f}s]")
    return found


def summary(rows: list[dict]) -> list[dict]:
    """Per model: the best-fit config that holds P100 with the fewest GPUs, over JSQ's and power of
    two's GPUs on the same decode-only workers (None where a count was not found)."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        base = {r["config"]: r.get("gpus") if r.get("holds") else None for r in mine}
        held = [r for r in mine if r["config"] not in (JSQ, P2) and r.get("holds")]
        best = min(held, key=lambda r: (r["gpus"], r["config"]), default=None)
        gpus = best["gpus"] if best else None
        out.append(
            {
                "model": model,
                "rate_rps": mine[0]["rate_rps"],
                "best": best["config"] if best else None,
                "aladdin_gpus": gpus,
                "jsq_gpus": base.get(JSQ),
                "p2_gpus": base.get(P2),
                "over_jsq": C.ratio(gpus, base.get(JSQ)),
                "over_p2": C.ratio(gpus, base.get(P2)),
            }
        )
    return out


def summary_text(split: list[dict]) -> str:
    """One line: each model's GPUs at P100 for best fit (its best held config), JSQ and power of two, and
    best fit's ratios, decode phase only ("none": no count held P100 on every seed at n and n + 1)."""
    parts = []
    for s in split:
        gpus = ", ".join(
            f"{name} {s[key] if s[key] is not None else 'none'}"
            for name, key in (("best fit", "aladdin_gpus"), ("JSQ", "jsq_gpus"), ("power-of-two", "p2_gpus"))
        )
        best = f" ({s['best']})" if s["best"] else ""
        ratios = ", ".join(
            f"{s[key]:.2f}× {name}"
            for name, key in (("JSQ", "over_jsq"), ("power-of-two", "over_p2"))
            if s[key]
        )
        parts.append(f"{s['model']} GPUs: {gpus}{best}" + (f"; {ratios}" if ratios else ""))
    return "split-phase decode at P100: " + "; ".join(parts) if parts else ""
