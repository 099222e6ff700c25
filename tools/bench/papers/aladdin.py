"""Aladdin (SLO-aware placement and worker sizing): GPUs needed for 99% SLO attainment vs arrival rate.

Setup (paper §6.3–6.4 → ours):

- Models and SLOs (Table 2, A100): Llama2-70B 1600/75 ms, 13B 600/30 ms, 7B 400/15 ms (TTFT/ATGT); a
  request meets its SLO only if both hold (``sim.metrics`` "aladdin").
- Hardware: A100 80GB (PCIe in the paper's testbed) → catalog ``a100-80gb`` (the NVLink SXM part).
- Workload: ShareGPT prompts, outputs capped at 2048 tokens, Poisson arrivals → (prompt, output) lengths
  of the Azure conv trace, prompts truncated to 2048 tokens and outputs to 2048 (Llama-2's 4096-token
  context), Poisson arrivals at each rate for ``duration`` seconds; same requests for every policy.
- Length prediction: Aladdin's empirical predictor (output-length distribution per input-length bin),
  fitted on 5,000 trace requests disjoint from the ones replayed; it also re-predicts requests that
  outlive their prediction.
- Policies: ``aladdin`` (``aladdin_bestfit`` dispatch, workers of N* GPUs from ``optimal_tp`` with the
  workload's mean KV per request and the paper's 4-GPU machines), ``jsq-opt`` (join-shortest-queue with
  the same N*), ``vllm-default`` (JSQ over 4-GPU workers, TP 4: the paper's default vLLM). Because the
  roofline makes N* = 4 here, the paper's own N* (Table 3: 7B 1, 13B 1, 70B 2 GPUs) is run as well
  (``aladdin@paper-N``, ``jsq@paper-N``). Engines: vLLM-like FCFS continuous batching.
- Metric: for each rate, the fewest workers (explicit plan of identical ``InstancePlan``s; gallop then
  bisect over the count) with ≥ 99% SLO attainment; GPUs = workers × TP. For Aladdin we also report
  the GPUs of workers that received any request at that count (best-fit opens a worker only when none
  is feasible, which is how the paper counts its GPUs).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from llmfleet.costmodel import RooflineModel, hardware, model_arch
from llmfleet.policies.placement import InstancePlan, optimal_tp
from llmfleet.sim.capacity import fewest_passing
from llmfleet.sim.run import PolicyBundle, simulate
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.types import Slo

from . import common as C

NAME = "aladdin"
TITLE = "Aladdin — GPUs for 99% SLO attainment vs arrival rate (Llama2, A100-80GB)"
HW = "a100-80gb"
GPUS_PER_MACHINE = 4  # the paper's testbed machines (default vLLM = all 4 in one worker)
TARGET = 0.99
THETA = 0.7
MAX_GPUS = 160
MODELS = {
    "llama2-7b": {"slo": (0.4, 0.015), "rates": (10.0, 25.0, 50.0), "paper_tp": 1},
    "llama2-13b": {"slo": (0.6, 0.030), "rates": (5.0, 12.0, 25.0), "paper_tp": 1},
    "llama2-70b": {"slo": (1.6, 0.075), "rates": (2.0, 5.0, 10.0), "paper_tp": 2},
}
CLAIM = (
    "in simulation (default continuous batching) up to 71% fewer GPUs than default vLLM and 40% fewer than "
    "JSQ with Aladdin's optimal worker configuration (split-phase decode: 60% fewer than JSQ, 49% fewer than "
    "power-of-two); on the A100 testbed, 70B: up to 3.5× fewer SLO violations than default vLLM."
)


def settings(quick: bool, tiny: bool) -> dict:
    if tiny:
        return {
            "models": {"llama2-7b": {**MODELS["llama2-7b"], "rates": (4.0,)}},
            "duration_s": 4.0,
            "min_requests": 0,
        }
    if quick:
        models = {"llama2-7b": {**MODELS["llama2-7b"], "rates": (10.0, 30.0)}}
        return {"models": models, "duration_s": 20.0, "min_requests": 200}
    return {"models": MODELS, "duration_s": 40.0, "min_requests": 600}


class _Search:
    """Fewest workers of ``tp`` GPUs reaching the target attainment; evaluations are memoised."""

    def __init__(self, model, tp, policy, wl, slo, predict, pred, hw) -> None:
        self.model, self.tp, self.policy, self.wl = model, tp, policy, wl
        self.slo, self.predict, self.pred, self.hw = slo, predict, pred, hw
        self.seen: dict[int, dict] = {}

    def bundle(self) -> PolicyBundle:
        if self.policy == "aladdin_bestfit":
            lat = {self.model: RooflineModel(model_arch(self.model), self.hw, self.tp)}
            opts = {
                "latency_models": lat,
                "slos": {self.model: self.slo},
                "predictor": self.pred,
                "theta": THETA,
            }
            return PolicyBundle("aladdin", dispatch="aladdin_bestfit", local="fcfs", dispatch_options=opts)
        return PolicyBundle(self.policy, dispatch=self.policy, local="fcfs")

    def eval(self, n: int) -> dict:
        if n not in self.seen:
            svc = SimService("chat", self.model, Slo(ttft_s=self.slo[0], tpot_s=self.slo[1]), max_tokens=2048)
            spec = SimSpec(ClusterSpec(n * self.tp, self.hw), (svc,))
            plan = [InstancePlan(f"w{i:03d}", (self.model,), self.tp) for i in range(n)]
            e = simulate(spec, self.wl, self.bundle(), plan=plan, predict=self.predict, samples=10)
            o = e.report["overall"]
            used = sum(i["tp"] for i in e.result.instances if i["iterations"] > 0)
            recs = e.result.records
            done = [r for r in recs if r.done]
            self.seen[n] = {
                "viol_ttft": sum(r.ttft_s > self.slo[0] for r in done) / max(1, len(recs)),
                "viol_atgt": sum(r.tpot_s > self.slo[1] for r in done) / max(1, len(recs)),
                "preemptions": o["preemptions"],
                "attainment": o["slo"]["aladdin"],
                "gpus_used": used,
                "ttft_p99_s": o["ttft_s"]["p99"],
                "tpot_p99_ms": 1e3 * o["tpot_s"]["p99"],
                "failed": o["failed"],
            }
        return self.seen[n]

    def ok(self, n: int) -> bool:
        return self.eval(n)["attainment"] >= TARGET

    def run(self, guess: int) -> int | None:
        return fewest_passing(self.ok, guess, max(1, MAX_GPUS // self.tp))


def run(quick: bool = False, log: C.Log = print, tiny: bool = False) -> dict:
    t0 = time.perf_counter()
    cfg = settings(quick, tiny)
    hw = hardware(HW)
    lengths = C.trace_lengths(max_prompt=2048, max_output=2048)
    train, test = C.split(lengths, 5000, seed=0)
    pred, predict = C.empirical_predictor(train)
    mean_seq = float(train.sum(axis=1).mean())
    rows, workers = [], {}
    for mi, (model, mc) in enumerate(cfg["models"].items()):
        arch = model_arch(model)
        n_star = optimal_tp(
            arch, hw, mc["slo"], mean_seq * arch.kv_bytes_per_token, gpus_per_node=GPUS_PER_MACHINE
        )
        configs = [("aladdin", "aladdin_bestfit", n_star), ("jsq-opt", "jsq", n_star)]
        if n_star != GPUS_PER_MACHINE:
            configs.append(("vllm-default", "jsq", GPUS_PER_MACHINE))
        if mc["paper_tp"] != n_star:
            configs += [
                (f"aladdin@{mc['paper_tp']}gpu", "aladdin_bestfit", mc["paper_tp"]),
                (f"jsq@{mc['paper_tp']}gpu", "jsq", mc["paper_tp"]),
            ]
        workers[model] = {"n_star": n_star, "paper_n": mc["paper_tp"]}
        guess: dict[str, int] = {}
        prev_rate: float | None = None
        for ri, rate in enumerate(mc["rates"]):
            dur = max(cfg["duration_s"], cfg["min_requests"] / rate)
            wl = C.poisson_workload(test, rate, dur, seed=1000 * mi + ri, service="chat")
            for label, policy, tp in configs:
                s = _Search(model, tp, policy, wl, mc["slo"], predict, pred, hw)
                base = guess.get(label) or guess.get(label.replace("aladdin", "jsq"))
                g = math.ceil(base * rate / prev_rate) if base and prev_rate else (base or 1)
                n = s.run(g)
                if n is not None:
                    guess[label] = n
                at = s.eval(n) if n is not None else {}
                rows.append(
                    {
                        "model": model,
                        "rate_rps": rate,
                        "config": label,
                        "policy": policy,
                        "tp": tp,
                        "workers": n,
                        "gpus": n * tp if n is not None else None,
                        "gpus_used": at.get("gpus_used"),
                        "attainment": at.get("attainment"),
                        "ttft_p99_s": at.get("ttft_p99_s"),
                        "tpot_p99_ms": at.get("tpot_p99_ms"),
                        "viol_ttft": at.get("viol_ttft"),
                        "viol_atgt": at.get("viol_atgt"),
                        "preemptions": at.get("preemptions"),
                        "plateau": None if n is not None else max(v["attainment"] for v in s.seen.values()),
                        "requests": len(wl),
                        "sims": len(s.seen),
                        "tried": {str(k): round(v["attainment"], 4) for k, v in sorted(s.seen.items())},
                    }
                )
                if label == "jsq-opt" and n_star == GPUS_PER_MACHINE:
                    rows.append({**rows[-1], "config": "vllm-default", "same_as": "jsq-opt"})
                log(
                    f"  aladdin {model} {rate:g} req/s {label:14s} TP{tp}: "
                    f"{'>' + str(MAX_GPUS) if n is None else n * tp} GPUs ({len(s.seen)} sims)"
                )
            prev_rate = rate
    result = {
        "paper": NAME,
        "title": TITLE,
        "setup": {
            "hardware": f"catalog {HW} (NVLink SXM; the paper's testbed A100s are PCIe), 4-GPU machines",
            "SLOs": "; ".join(
                f"{m}: TTFT {c['slo'][0] * 1e3:.0f} ms, ATGT {c['slo'][1] * 1e3:.0f} ms"
                for m, c in cfg["models"].items()
            ),
            "workload": f"Poisson, max({cfg['duration_s']:g} s, {cfg['min_requests']} requests) per rate; conv-trace lengths, prompt ≤ 2048, output ≤ 2048 "
            f"(mean prompt+output {mean_seq:.0f} tokens)",
            "predictor": "empirical per input-length bin, fitted on 5,000 disjoint trace requests; re-prediction on",
            "worker size N*": ", ".join(
                f"{m}: {w['n_star']} (optimal_tp, roofline) vs paper {w['paper_n']}"
                for m, w in workers.items()
            ),
            "Aladdin options": f"γ = 0.5, θ = {THETA}",
            "search": f"fewest workers with ≥ {TARGET:.0%} Aladdin SLO attainment (gallop + bisection, ≤ {MAX_GPUS} GPUs)",
            "cost model": "roofline (not GPU-fitted); engines FCFS continuous batching",
        },
        "workers": workers,
        "rows": rows,
        "wall_s": 0.0,
    }
    _summarize(result)
    result["wall_s"] = time.perf_counter() - t0
    return result


def _gpus(rows, model, rate, config, key="gpus"):
    r = next(
        (x for x in rows if x["model"] == model and x["rate_rps"] == rate and x["config"] == config), None
    )
    return None if r is None else r.get(key)


def _summarize(res: dict) -> None:
    rows = res["rows"]
    per = []
    for model in dict.fromkeys(r["model"] for r in rows):
        rates = sorted({r["rate_rps"] for r in rows if r["model"] == model})
        for rate in rates:
            a, j, v = (_gpus(rows, model, rate, c) for c in ("aladdin", "jsq-opt", "vllm-default"))
            au = _gpus(rows, model, rate, "aladdin", "gpus_used")
            per.append(
                {
                    "model": model,
                    "rate_rps": rate,
                    "aladdin": a,
                    "aladdin_used": au,
                    "jsq_opt": j,
                    "vllm_default": v,
                    "aladdin_over_jsq": C.ratio(a, j),
                    "aladdin_used_over_jsq": C.ratio(au, j),
                    "aladdin_over_vllm": C.ratio(a, v),
                    "top": rate == rates[-1],
                }
            )
    top = [p for p in per if p["top"]]
    tot_a = sum(p["aladdin"] for p in top if p["aladdin"] is not None and p["jsq_opt"] is not None)
    tot_j = sum(p["jsq_opt"] for p in top if p["aladdin"] is not None and p["jsq_opt"] is not None)
    tot_au = sum(p["aladdin_used"] for p in top if p["aladdin_used"] is not None and p["jsq_opt"] is not None)
    tot_v = sum(p["vllm_default"] for p in top if p["aladdin"] is not None and p["vllm_default"] is not None)
    ours = C.ratio(tot_a, tot_j)
    best = min((p["aladdin_over_jsq"] for p in per if p["aladdin_over_jsq"] is not None), default=None)
    paper_cfg = [
        (
            p,
            _gpus(rows, p["model"], p["rate_rps"], f"aladdin@{res['workers'][p['model']]['paper_n']}gpu"),
            _gpus(rows, p["model"], p["rate_rps"], f"jsq@{res['workers'][p['model']]['paper_n']}gpu"),
        )
        for p in top
    ]
    paper_ratio = C.ratio(
        sum(a for _, a, j in paper_cfg if a and j), sum(j for _, a, j in paper_cfg if a and j)
    )
    res["summary"] = {
        "per_rate": per,
        "top_rate_gpus": {"aladdin": tot_a, "aladdin_used": tot_au, "jsq_opt": tot_j, "vllm_default": tot_v},
        "aladdin_over_jsq_top": ours,
        "aladdin_used_over_jsq_top": C.ratio(tot_au, tot_j),
        "aladdin_over_vllm_top": C.ratio(tot_a, tot_v),
        "best_aladdin_over_jsq": best,
        "paper_n_aladdin_over_jsq_top": paper_ratio,
    }
    res["claim"] = CLAIM
    res["goal"] = {
        "text": "Aladdin ≤ 0.6× the GPUs of JSQ (optimal worker size) at 99% SLO attainment",
        "target": 0.6,
        "ours": ours,
        "ours_text": f"{C.fmt(ours)}× at each model's highest rate (Σ {tot_a} vs {tot_j} GPUs; best point "
        f"{C.fmt(best)}×; counting only workers that got requests {C.fmt(C.ratio(tot_au, tot_j))}×)",
        "met": ours is not None and ours <= 0.6,
    }
    res["ours"] = (
        f"at each model's highest rate Aladdin needs {tot_a} GPUs (used {tot_au}) vs JSQ-optimal {tot_j} and "
        f"default vLLM {tot_v}: {C.fmt(ours)}× JSQ, {C.fmt(C.ratio(tot_a, tot_v))}× vLLM; "
        f"with the paper's worker sizes: {C.fmt(paper_ratio)}× JSQ."
    )
    found = [r for r in rows if r.get("workers") is not None and not r.get("same_as")]
    pre = sum(r.get("preemptions") or 0 for r in found)
    v_ttft = sum(r.get("viol_ttft") or 0 for r in found)
    v_atgt = sum(r.get("viol_atgt") or 0 for r in found)
    stuck = [r for r in rows if r.get("workers") is None]
    w7 = model_arch("llama2-7b").weight_bytes / hardware(HW).bandwidth
    notes = [
        "The roofline has no fixed per-iteration cost and the catalog A100 is the NVLink part, so Eq. 6 "
        "(`optimal_tp`) picks 4-GPU workers (capped by the paper's 4-GPU machines) where the paper measured "
        "1 GPU for 7B/13B and 2 for 70B: at TP 1 a 7B decode iteration already spends "
        f"{1e3 * w7:.1f} ms of the 15 ms ATGT budget reading weights. JSQ-optimal and default vLLM are then the same configuration, and with "
        "few large workers GPU counts move in steps of 4, which hides placement gains; the paper-N rows show "
        "the fine-grained case.",
        "ATGT in the simulator includes the prefills that continuous batching interleaves (a mixed iteration "
        "costs the prefill plus the decode, sharing one weight read; no chunked prefill), so a request with a few dozen output tokens misses its "
        "ATGT when one long prompt is prefilled during its life. Constraint (b) bounds only the decode "
        "context and (d) protects ongoing requests with an iteration clock that ignores those stalls, so "
        "best-fit's packing is optimistic and concentrates exactly the collisions that JSQ's spreading "
        f"avoids. At the reported points {C.fmt(100 * v_atgt / max(1, len(found)), '.2f')}% of requests "
        f"missed ATGT and {C.fmt(100 * v_ttft / max(1, len(found)), '.2f')}% TTFT on average; "
        f"{pre} preemptions in total (KV seldom binds on 80 GB GPUs, which is where best-fit beats JSQ in "
        "the paper's Figure 3).",
        f"θ = {THETA} (policy default 0.9): in a separate check with this cost model (7B, TP 1, Poisson 40 req/s "
        "for 40 s) best-fit with θ = 0.9 stayed at 98.93% attainment with 20, 24 and 28 workers (the added "
        "workers stay empty), so no count reaches 99%; θ = 0.7 gives 99.62% at 20.",
        "Attainment is not monotone in the worker count (a different count changes which requests collide), "
        "so the bisection's answer can move by a worker between neighbouring rates; the `tried` lists in "
        "the JSON show every count simulated.",
    ]
    if stuck:
        notes.append(
            "No worker count reached 99% for: "
            + "; ".join(
                f"{r['model']} {r['rate_rps']:g} req/s {r['config']} (plateau {C.fmt(r['plateau'], '.4f')})"
                for r in stuck
            )
            + " — best-fit leaves the added workers empty once its constraints say the loaded ones suffice."
        )
    res["notes"] = notes


COLUMNS = (
    ("model", "model", ""),
    ("req/s", "rate_rps", ".0f"),
    ("config", "config", ""),
    ("TP", "tp", ""),
    ("workers", "workers", ""),
    ("GPUs", "gpus", ""),
    ("GPUs used", "gpus_used", ""),
    ("SLO attain.", "attainment", ".4f"),
    ("TTFT p99 s", "ttft_p99_s", ".3f"),
    ("ATGT p99 ms", "tpot_p99_ms", ".1f"),
    ("sims", "sims", ""),
)


def markdown(res: dict) -> str:
    extra = ["GPU ratios per rate:", ""]
    extra.append(
        C.md_table(
            res["summary"]["per_rate"],
            [
                ("model", "model", ""),
                ("req/s", "rate_rps", ".0f"),
                ("Aladdin", "aladdin", ""),
                ("Aladdin used", "aladdin_used", ""),
                ("JSQ-opt", "jsq_opt", ""),
                ("vLLM default", "vllm_default", ""),
                ("Aladdin/JSQ", "aladdin_over_jsq", ".2f"),
                ("used/JSQ", "aladdin_used_over_jsq", ".2f"),
                ("Aladdin/vLLM", "aladdin_over_vllm", ".2f"),
            ],
        )
    )
    return C.section(res, C.md_table(res["rows"], COLUMNS), extra)


def plot(res: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(4.4 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for cfg in dict.fromkeys(r["config"] for r in rows if r["model"] == model):
            pts = sorted(
                (r["rate_rps"], r["gpus"])
                for r in rows
                if r["model"] == model and r["config"] == cfg and r["gpus"]
            )
            style = "--" if cfg == "vllm-default" else "-"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=cfg)
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel(f"GPUs for {TARGET:.0%} SLO attainment")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(TITLE, fontsize=10)
    fig.tight_layout()
    path = out / "aladdin_gpus.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
