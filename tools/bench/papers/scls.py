"""SCLS (slice-level scheduling for static batching): throughput, mean and p95 response time vs rate.

Setup (paper §5.1 → ours):

- 8 LLaMA2-13B workers on 8 A100 80GB, one per GPU → 8 × TP-1 instances on catalog ``a100-80gb``.
- Requests: CodeFuse trace, Poisson arrivals for 10 minutes, input truncated to 1024 tokens, generation
  capped at 1024 (§5.1 "Settings", "Workflow") → ShareGPT-like short prompts (the CodeFuse trace is not
  public; the paper's own length analysis, §3.3 Fig. 6, is of CodeFuse and ShareGPT): 20,000 pairs
  synthesized from the ShareGPT means published with vLLM (input 161.31, output 337.99 tokens;
  ``llmfleet.workload.paperlike``), or the Alpaca lengths with ``run.py --alpaca PATH``; the same caps,
  Poisson arrivals for ``duration`` s.
- Engine: HuggingFace-style static batching — a batch is padded to its longest prompt, reserves its
  padded KV up front and returns every row when the batch ends (``static_release="batch_end"``); the
  padded prefill may hold 32,768 tokens (HF has no token budget; 32 rows × 1024).
- Policies: ``scls`` (DP slice batcher, S = 128, ζ = 0.9, recompute mode, + max-min offloading by
  estimated serve time), ``sls`` (FCFS static batches of 16, round robin: the paper's HF baseline) and
  ``cb`` (continuous batching, FCFS, round robin, vLLM's default engine limits; the paper's ILS baseline
  is DeepSpeed-FastGen v0.2.0 (§3.1), whose Dynamic SplitFuse mixes prompt chunks with decodes in one
  forward pass, so ``cb`` keeps FCFS's mixed iterations rather than vLLM 0.2–0.4's single-phase ones).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from llmfleet.costmodel import SclsDecode, SclsModel, SclsPrefill, cost_record, hardware, model_arch
from llmfleet.policies.placement import InstancePlan
from llmfleet.sim.run import PolicyBundle
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec

from . import common as C

NAME = "scls"
TITLE = "SCLS — slice-level scheduling, LLaMA2-13B on 8 A100-80GB (throughput, mean/p95 response time)"
MODEL = "llama2-13b"
GPUS = 8
SLICE = 128
MAX_LEN = 1024
CLAIM = (
    "with HF static batching, SCLS raises throughput by 232.3–315.8% over SLS (batch 16) and cuts the average "
    "response time by 82.4–84.9% and the p95 by 79.8–81.0% (DeepSpeed: +82.5–191.9% throughput; vs "
    "FastGen ILS +61.6–171.0%)."
)
STATIC_ENGINE = EngineSettings(max_prefill_tokens=32768, static_release="batch_end")
# the central scheduler's DP bounds memory only: its padded prefills reach ~48k tokens on this setup,
# whose activations the instance must reserve (see llmfleet.sim.scls_central)
CENTRAL_ENGINE = EngineSettings(max_prefill_tokens=49152, static_release="batch_end")


def settings(quick: bool, tiny: bool) -> dict:
    if tiny:
        return {"rates": (4.0,), "duration_s": 8.0, "lengths": ()}
    if quick:
        return {"rates": (8.0, 20.0), "duration_s": 120.0, "lengths": ()}
    # run length: the top rate's workload (same seed) cut at 120 and 300 s, beside the sweep's 600 s
    return {"rates": (4.0, 8.0, 12.0, 16.0, 24.0), "duration_s": 600.0, "lengths": (120.0, 300.0)}


def estimator() -> dict[str, dict[str, float]]:
    """SCLS's T_serve estimator: its forms fitted to the selected cost source's points for the paper's
    model and GPU (``costmodel.cost_record``), as the policies' ``cost`` option."""
    rec = cost_record(model_arch(MODEL), hardware("a100-80gb"), 1, C.COST_SOURCE, date="1970-01-01T00:00:00")
    return {"prefill": rec.scls.prefill.to_dict(), "decode": rec.scls.decode.to_dict()}


def policies() -> list[tuple[PolicyBundle, EngineSettings]]:
    slc = {"slice_iterations": SLICE, "cost": estimator()}
    return [
        (
            PolicyBundle("scls", dispatch={"policy": "scls_central", "options": {**slc, "slice_end": "recompute"}},
                         description="SCLS (the paper): central pool, DP batches every interval "
                         "T = max(λ·min load, Γ = 6 s), max-min offload, recompute at a slice end"),
            CENTRAL_ENGINE,
        ),
        (
            PolicyBundle("scls-keep", dispatch={"policy": "scls_central",
                                                "options": {**slc, "slice_end": "keep", "keep_affinity": True}},
                         description="SCLS central, KV kept across slices when re-batched on the same GPU "
                         "(our extension)"),
            CENTRAL_ENGINE,
        ),
        (
            PolicyBundle("scls-local", dispatch={"policy": "scls_maxmin", "options": slc},
                         engine={"policy": "scls", "options": {**slc, "slice_end": "recompute"}},
                         description="SCLS per engine: each engine's DP over its own queue when idle, "
                         "requests max-min dispatched on arrival (the pre-central variant)"),
            STATIC_ENGINE,
        ),
        (
            PolicyBundle("sls", dispatch="round_robin",
                         engine={"policy": "static_sls", "options": {"batch_size": 16, "slice_end": "recompute"}},
                         description="SLS: FCFS static batches of 16, round robin"),
            STATIC_ENGINE,
        ),
        (
            PolicyBundle("cb", dispatch="round_robin", engine="fcfs",
                         description="continuous batching (FCFS, mixed iterations as FastGen's SplitFuse), round robin"),
            EngineSettings(),
        ),
    ]  # fmt: skip


# the sweep's policies (``policies()``'s names) and the run-length study's
SWEEP = ("scls", "scls-keep", "scls-local", "sls", "cb")
LENGTH_POLICIES = ("scls", "sls")
# expected CPU seconds per request simulated, per policy (a 600 s full run at 24 req/s on a quiet core)
SECONDS_PER_REQUEST = {"scls": 4e-4, "scls-keep": 8e-4, "scls-local": 8e-4, "sls": 2e-4, "cb": 5e-4}


def _lengths() -> tuple[np.ndarray, str, str]:
    """The request lengths (ShareGPT-like or ``--alpaca``), their label and the workload's tag."""
    lengths, label = C.short_prompt_lengths(20_000, seed=17, max_prompt=MAX_LEN, max_output=MAX_LEN)
    return lengths, label, "Alpaca" if C.SHORT_ALPACA is not None else "ShareGPT-like"


def _jobs(cfg: dict) -> list[tuple[str, float, float, int, str]]:
    """Every simulation: (kind, rate, seconds of arrivals, the rate's index, policy); ``sweep`` rows at
    every rate, then the ``length`` study at the top rate (its workload cut shorter, same seed)."""
    top_i, top = len(cfg["rates"]) - 1, cfg["rates"][-1]
    return [("sweep", r, cfg["duration_s"], i, p) for i, r in enumerate(cfg["rates"]) for p in SWEEP] + [
        ("length", top, h, top_i, p) for h in cfg["lengths"] for p in LENGTH_POLICIES
    ]


def _key(job: tuple) -> str:
    kind, rate, horizon, _, policy = job
    return f"{kind}/{rate:g}/{horizon:g}/{policy}"


def parts(quick: bool = False, tiny: bool = False) -> list[tuple[str, float, tuple]]:
    """One unit per simulation for run.py's pool: (key, expected seconds, job)."""
    return [
        (_key(job), job[1] * job[2] * SECONDS_PER_REQUEST[job[4]], job)
        for job in _jobs(settings(quick, tiny))
    ]


def run_part(job: tuple) -> dict:
    """One simulation (see :func:`_jobs`): a sweep row, or the run-length study's throughput."""
    kind, rate, horizon, i, name = job
    lengths, _, tag = _lengths()
    plan = [InstancePlan(f"gpu{g}", (MODEL,), 1) for g in range(GPUS)]
    svc = (SimService("chat", MODEL, max_tokens=MAX_LEN),)
    wl = C.poisson_workload(lengths, rate, horizon, seed=200 + i, service="chat", model=MODEL)
    bundle, eng = next((b, e) for b, e in policies() if b.name == name)
    spec = SimSpec(ClusterSpec.parse(f"{GPUS}xA100-80GB"), svc, eng)
    m = C.metrics(C.simulate(spec, wl, bundle, plan=plan, samples=40))
    if kind == "length":
        return {"requests": len(wl), "throughput_rps": m["throughput_rps"]}
    return {"rate_rps": rate, "policy": name, "workload": f"{tag}, Poisson", **m}


def run(quick: bool = False, log: C.Log = print, tiny: bool = False) -> dict:
    """Every simulation in this process, then :func:`combine`."""
    t0 = time.perf_counter()
    out = {}
    for key, _, job in parts(quick, tiny):
        out[key] = r = run_part(job)
        if job[0] == "sweep":
            log(f"  scls {job[1]:g} req/s ({r['requests']} req) {job[4]:5s} tput {r['throughput_rps']:.2f} req/s "
                f"mean {r['latency_mean_s']:.1f}s p95 {r['latency_p95_s']:.1f}s [{r['sim_wall_s']:.1f}s]")  # fmt: skip
    result = combine(out, quick=quick, tiny=tiny, log=log)
    result["wall_s"] = time.perf_counter() - t0
    return result


def combine(results: dict[str, dict], quick: bool = False, tiny: bool = False, log: C.Log = print) -> dict:
    """The paper's result from the simulations' results (``results``: key → :func:`run_part`'s dict)."""
    cfg = settings(quick, tiny)
    _, lengths_label, tag = _lengths()
    jobs = _jobs(cfg)
    rows = [results[_key(j)] for j in jobs if j[0] == "sweep"]
    lengths_rows = []
    for h in cfg["lengths"]:
        got = {j[4]: results[_key(j)] for j in jobs if j[0] == "length" and j[2] == h}
        entry = {"horizon_s": h, "rate_rps": cfg["rates"][-1], "requests": got["scls"]["requests"]}
        entry.update({f"{p}_tput": got[p]["throughput_rps"] for p in LENGTH_POLICIES})
        entry["ratio"] = C.ratio(entry["scls_tput"], entry["sls_tput"])
        lengths_rows.append(entry)
        log(f"  scls run length {h:g}s at {entry['rate_rps']:g} req/s: ×{C.fmt(entry['ratio'])} throughput")
    result = {
        "paper": NAME,
        "title": TITLE,
        "setup": {
            "cluster": f"{GPUS} × {MODEL} on catalog a100-80gb, one TP-1 instance per GPU",
            "workload": f"Poisson {', '.join(f'{r:g}' for r in cfg['rates'])} req/s for {cfg['duration_s']:g} s; "
            f"{lengths_label}; input ≤ {MAX_LEN}, output ≤ {MAX_LEN}",
            "static engine": "pad to the longest prompt, KV reserved up front, rows returned at batch end (HF); "
            "padded prefill ≤ 32,768 tokens",
            "SCLS": f"S = {SLICE}, ζ = 0.9, central scheduling (§4): the pool is partitioned by the DP every "
            "interval T = max(0.5·min load, Γ = 6 s), batches go max-min to the GPUs, unfinished rows return "
            "to the pool and re-prefill prompt + output so far (recompute); scls-keep keeps their KV when "
            "re-batched on the same GPU; scls-local is the per-engine variant",
            "cost model": f"{C.cost_label()}; SCLS's estimator is that cost source fitted to its T_serve form",
        },
        "workload": f"{tag} lengths, Poisson",
        "cost_source": C.COST_SOURCE,
        "rows": rows,
        "run_length": lengths_rows,
        "duration_s": cfg["duration_s"],
        "wall_s": 0.0,
    }
    _summarize(result)
    return result


def _at(rows, rate, policy):
    return next(r for r in rows if r["rate_rps"] == rate and r["policy"] == policy)


def _summarize(res: dict) -> None:
    rows = res["rows"]
    rates = sorted({r["rate_rps"] for r in rows})
    per = []
    for rate in rates:
        s, b, c = (_at(rows, rate, p) for p in ("scls", "sls", "cb"))
        per.append(
            {
                "rate_rps": rate,
                "tput_scls_over_sls": C.ratio(s["throughput_rps"], b["throughput_rps"]),
                "mean_cut_vs_sls": 1 - C.ratio(s["latency_mean_s"], b["latency_mean_s"]),
                "p95_cut_vs_sls": 1 - C.ratio(s["latency_p95_s"], b["latency_p95_s"]),
                "tput_scls_over_cb": C.ratio(s["throughput_rps"], c["throughput_rps"]),
                "mean_scls_over_cb": C.ratio(s["latency_mean_s"], c["latency_mean_s"]),
            }
        )
    top = per[-1]
    best = max(p["tput_scls_over_sls"] for p in per)
    # where a slice's time goes under the estimator: prefill share of T_serve for a typical full batch
    est = estimator()
    cost = SclsModel(SclsPrefill(**est["prefill"]), SclsDecode(**est["decode"]))
    n, length = 32, 512
    pre_share = cost.prefill.predict(n, length) / cost.t_serve(n, length, SLICE)
    res["summary"] = {"per_rate": per, "best_tput_ratio": best, "slice_prefill_share_n32_l512": pre_share}
    res["claim"] = CLAIM
    res["goal"] = {
        "text": "SCLS ≥ 3× the throughput of SLS (batch 16)",
        "target": 3.0,
        "ours": top["tput_scls_over_sls"],
        "ours_text": f"{C.fmt(top['tput_scls_over_sls'])}× at {rates[-1]:g} req/s (best {C.fmt(best)}×)",
        "met": top["tput_scls_over_sls"] is not None and top["tput_scls_over_sls"] >= 3.0,
    }
    res["ours"] = (
        f"at {rates[-1]:g} req/s SCLS serves {C.fmt(_at(rows, rates[-1], 'scls')['throughput_rps'])} req/s vs SLS "
        f"{C.fmt(_at(rows, rates[-1], 'sls')['throughput_rps'])} ({C.fmt(top['tput_scls_over_sls'])}×, "
        f"+{C.fmt(100 * (top['tput_scls_over_sls'] - 1), '.0f')}%), mean response time "
        f"{C.fmt(100 * top['mean_cut_vs_sls'], '.0f')}% lower, p95 {C.fmt(100 * top['p95_cut_vs_sls'], '.0f')}% lower; "
        f"continuous batching serves {C.fmt(_at(rows, rates[-1], 'cb')['throughput_rps'])} req/s."
    )
    lens = res.get("run_length") or []
    length_note = (
        [
            f"Run length at {rates[-1]:g} req/s (the same seeded process, cut shorter): "
            + ", ".join(f"{e['horizon_s']:g} s → ×{C.fmt(e['ratio'])}" for e in lens)
            + f", {C.fmt(_at(rows, rates[-1], 'scls')['throughput_rps'] / _at(rows, rates[-1], 'sls')['throughput_rps'])}× "
            f"at the sweep's {res.get('duration_s', 0):g} s: throughput is completions ÷ makespan, and SLS's backlog drains after the "
            "arrivals end, so the ratio depends on how long the run is."
        ]
        if lens
        else []
    )
    res["notes"] = [
        *length_note,
        f"The {res['cost_source']} cost charges a static batch as a vLLM-like engine's iteration (measured "
        "operators plus vLLM's per-iteration CPU overhead under `calibrated`). HF `generate`'s real per-step cost "
        "(Python loop, no paged attention, padded attention over the whole batch) is higher still, which is "
        "what makes SLS's long tails (every row waits for the batch's longest output) so expensive on the "
        "paper's testbed; here a decode step of a 16-row 13B batch costs little more than reading the weights "
        "once, so SLS loses less.",
        "SCLS runs the paper's recompute mode: every slice re-prefills prompt + output so far, padded to the "
        f"batch's longest. A padded prefill is compute-bound and expensive: for 32 rows of "
        f"512 tokens the prefill is {C.fmt(100 * pre_share, '.0f')}% of a {SLICE}-iteration slice "
        "(`T_prefill / T_serve`), and a request needs ⌈output / 128⌉ slices.",
        "SCLS runs as the paper's central scheduler: requests wait for the next interval (Γ = 6 s, the HF "
        "value) even when GPUs are idle, which costs latency at low load; scls-local forms a batch whenever "
        "its engine is idle instead.",
        "Continuous batching (vLLM-like, paged KV, no padding, per-token release) is the strongest policy "
        "here; the paper's ILS baseline is DeepSpeed-FastGen, whose conservative KV admission we do not model.",
    ]


COLUMNS = (
    ("req/s", "rate_rps", ".0f"),
    ("policy", "policy", ""),
    ("workload", "workload", ""),
    ("cost", "cost_source", ""),
    ("throughput req/s", "throughput_rps", ".2f"),
    ("tok/s", "throughput_tokens_per_s", ".0f"),
    ("mean RT s", "latency_mean_s", ".1f"),
    ("p95 RT s", "latency_p95_s", ".1f"),
    ("p99 RT s", "latency_p99_s", ".1f"),
    ("done", "completed", ""),
    ("makespan s", "makespan_s", ".0f"),
)


def markdown(res: dict) -> str:
    extra = ["SCLS vs the baselines per rate:", ""]
    extra.append(
        C.md_table(
            res["summary"]["per_rate"],
            [
                ("req/s", "rate_rps", ".0f"),
                ("tput SCLS/SLS", "tput_scls_over_sls", ".2f"),
                ("mean RT cut vs SLS", "mean_cut_vs_sls", ".0%"),
                ("p95 RT cut vs SLS", "p95_cut_vs_sls", ".0%"),
                ("tput SCLS/CB", "tput_scls_over_cb", ".2f"),
                ("mean RT SCLS/CB", "mean_scls_over_cb", ".1f"),
            ],
        )
    )
    return C.section(res, C.md_table(res["rows"], COLUMNS), extra)


def plot(res: dict, out: Path) -> list[Path]:
    return [
        C.plot_sweep(
            res["rows"],
            [
                ("throughput_rps", "throughput (req/s)", False),
                ("latency_mean_s", "mean response time (s)", True),
                ("latency_p95_s", "p95 response time (s)", True),
            ],
            out / "scls_sweep.png",
            TITLE,
        )
    ]
