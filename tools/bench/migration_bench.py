"""Mell migration benchmark (``make bench-migration``): JSON + markdown + PNG under --out.

Mell (papers/mell.txt, notes in design/papers/mell.md) migrates running requests with their KV between
GPUs so that fewer GPUs hold requests. Everything runs in the simulator on the roofline cost models of
catalog hardware; nothing here is tuned to reach a goal.

Setups (the paper's: one model instance per GPU, Llama-2-7B/13B on RTX 4090 and A100-40GB):

- ``a100-7b``: Llama-2-7B on A100-40GB; ``4090-7b``: Llama-2-7B on RTX 4090; ``a100-13b``: Llama-2-13B
  on A100-40GB (the paper's 13B runs on its A100s: 13B leaves a 4090 no KV). 40 GPUs each, so that no
  policy runs out (at 32, Mell's peak reached 31 on Alpaca × 10 at the high level): the metric is how
  many of them hold requests, not whether the cluster copes. Runs whose peak reaches 40 are flagged.
- Load levels: the paper's three Poisson rates λ = 0.5 / 0.8 / 1.1 (infrequent / middle / frequent)
  keep their ratios: ``low`` / ``mid`` / ``high`` = 6.25 / 10 / 13.75 × the Azure conv trace's mean rate
  (5.53 req/s; ×10 at ``mid``, the scale the brief suggested), each multiplied by the setup's KV
  capacity C relative to 7B on A100-40GB (C = 14.2k tokens on a 4090 and for 13B, 46.8k for 7B on
  A100), so that every setup sees about the same demand per GPU of KV and none saturates the cluster.
  The paper's absolute λ belong to its 10×-longer conversations on its own cluster and do not carry over.
- Workloads (prompts and outputs truncated to Llama-2's 4,096-token context, the output first):

  * ``conv-poisson``: conv-trace (prompt, output) lengths, Poisson arrivals at each level (the paper's
    Poisson workloads);
  * ``conv-trace``: the trace's own arrivals and lengths, its first ``horizon × scale`` seconds replayed
    ``scale`` × faster (the paper's Azure-trace workload; scale = the level's multiple);
  * ``alpaca10-poisson``: Alpaca lengths × 10, Poisson at each level. The paper scales its chat
    conversations (LMSYS-Chat, WildChat: short prompts, few hundred output tokens) ten-fold to mimic
    long-context models; Alpaca × 10 (mean 205 + 670 tokens) is the closest such workload here. The
    conv trace is not scaled: its mean prompt is already 1,155 tokens, ×10 would truncate nearly all;
  * ``alpaca-poisson`` (full run only): raw Alpaca (mean 20 + 67 tokens) at the ``mid`` rate, a
    control where KV is not the binding constraint (256 requests per batch cap a GPU long before its KV);
    reported, but left out of the goals.

Policies (the paper's baselines): ``BF`` best-fit dispatch by free KV, no migration; ``WF`` worst-fit
(most free KV), no migration; ``LB`` worst-fit + Llumnix load-balancing migration (KV transfers, as the
paper's LB); ``Mell`` Mell dispatch (where Allocate would put the request) + Mell's packer every 1 s
epoch with operation batching and hybrid transfer; ``Mell+`` the same with the packer's ``fill_first``
option (beyond the paper: before Allocate opens a GPU, the item goes to an active GPU of any type with
room, best fit; dispatch follows through the view); ``Mell++`` Mell+ with ``compact`` (beyond the
paper: each epoch the GPU with the least KV is emptied when its items fit in the others' room).

Sections:

1. **headline** — per setup × workload: peak and time-averaged active GPUs (GPUs holding requests),
   their ratios to the fluid bound of the same run (Σ⌈KV(t)/C⌉: peak/peak, mean/mean), mean KV
   utilization of active GPUs (KV in use / C, where the paper defines C as "the memory capacity for the
   KV cache in each GPU": the goal's metric, and the only reading under which its baselines' ~65–80 %
   make sense) and, beside it, (weights + KV in use) / GPU memory, migrations per request, p99 latency,
   failures; each Mell variant's GPU saving vs each baseline. Goals (reported, not tuned for), for each
   Mell variant: peak ≤ 1.10 × fluid bound; peak ≤ 4/3 × fluid bound + 3 (Theorem 2: |A(I)| ≤ 4/3·OPT +
   c, c = the open T-, S- and M-GPUs that may be part-full; OPT ≥ the fluid bound, so this is a
   sufficient check); KV utilization ≥ 88 %; 9–31 % fewer GPUs than the baselines (paper).
2. **batching** — Mell with operation batching on vs off on the same workloads: migrations per request,
   moves cancelled, reduction (paper: up to 30 %).
3. **transfer** — Mell with KV-only, tokens-only (re-prefill) and hybrid transfer: KV transfer seconds,
   re-prefill tokens, deferred moves, p99 latency, mean TPOT and latency vs hybrid.

Runs go to ``--processes`` worker processes (default 2, the machine's cores). ``--quick``: the ``mid``
level only, 60 s of arrivals, no raw-Alpaca control; ``--only SECTION`` (repeatable) runs some sections
and merges them into an existing migration.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from llmfleet.costmodel import hardware, model_arch
from llmfleet.sim.memory import pool_layout
from llmfleet.sim.run import PolicyBundle, simulate
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.workload import Workload
from llmfleet.workload.datasets import alpaca_lengths

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_common  # noqa: E402

C = bench_common.load()
COST = (
    "the simulator's roofline cost models on catalog hardware (a100-40gb, rtx-4090) × catalog models "
    "(llama2-7b, llama2-13b); not GPU-fitted"
)
CONTEXT = 4096  # Llama-2
GPUS = 40
LEVELS = {"low": 6.25, "mid": 10.0, "high": 13.75}  # × the trace's mean rate (paper: λ 0.5 / 0.8 / 1.1)
SETUPS: dict[str, tuple[str, str, str]] = {
    "a100-7b": ("A100-40GB", "llama2-7b", "Llama-2-7B on A100-40GB"),
    "4090-7b": ("RTX-4090", "llama2-7b", "Llama-2-7B on RTX 4090"),
    "a100-13b": ("A100-40GB", "llama2-13b", "Llama-2-13B on A100-40GB"),
}
REF_SETUP = "a100-7b"
BASELINES = ("BF", "WF", "LB")
THEOREM_RATIO = 4 / 3  # Mell Theorem 2: |A(I)| ≤ 4/3·OPT(I) + c
THEOREM_ADDITIVE = 3  # c: the most recently opened T-, S- and M-GPUs may be part-full (proof of Theorem 2)
CONTROLS = ("alpaca-poisson",)  # KV is not the binding constraint there: reported, not in the goals
# the paper's Mell; beyond the paper: Mell+ (fill_first), Mell++ (fill_first + compact)
MELLS = ("Mell", "Mell+", "Mell++")
HEADLINE = (*BASELINES, *MELLS)
SECTIONS = ("headline", "batching", "transfer")
SECTION_VARIANTS = {
    "headline": HEADLINE,
    "batching": ("Mell", "Mell-nobatch"),
    "transfer": ("Mell-kv", "Mell-tokens", "Mell"),
}
PLOT_RUN = ("a100-7b", "conv-poisson")  # the time-series plot: at the highest level run (paper Fig. 15)


# the paper's WF: worst fit among the active GPUs, a new GPU only when none fits
WF_OPTIONS = {"active_only": True}


def bundle(variant: str) -> PolicyBundle:
    """The policy bundle of one variant (see the module docstring)."""
    if variant == "BF":
        return PolicyBundle("bf", "dedicated_even", "best_fit_kv", "fcfs")
    if variant == "WF":
        return PolicyBundle("wf", "dedicated_even", "worst_fit_kv", "fcfs", dispatch_options=WF_OPTIONS)
    if variant == "LB":
        return PolicyBundle(
            "lb", "dedicated_even", "worst_fit_kv", "fcfs", dispatch_options=WF_OPTIONS,
            migration="llumnix_lb", transfer="kv",
        )  # fmt: skip
    if variant == "Mell":
        return PolicyBundle("mell", "dedicated_even", "mell", "fcfs", migration="mell", transfer="hybrid")
    if variant == "Mell+":  # beyond the paper: before Allocate opens a GPU, fill an active one (best fit)
        return dataclasses.replace(bundle("Mell"), name="mell-fill", migration_options={"fill_first": True})
    if variant == "Mell++":  # beyond the paper: Mell+ and, each epoch, empty one GPU into the others' room
        return dataclasses.replace(
            bundle("Mell"), name="mell-fill-compact", migration_options={"fill_first": True, "compact": True}
        )
    if variant == "Mell-nobatch":
        return dataclasses.replace(bundle("Mell"), name="mell-nobatch", migration_options={"batching": False})
    if variant in ("Mell-kv", "Mell-tokens"):
        mode = variant.split("-")[1]
        return dataclasses.replace(bundle("Mell"), name=f"mell-{mode}", transfer=mode)
    raise ValueError(f"unknown variant {variant!r}")


# ------------------------------------------------------------------------------------------ workloads
def kv_capacity(setup: str) -> int:
    """C: the KV bytes of one instance of the setup's model on one of its GPUs (the simulator's sizing)."""
    hw, model, _ = SETUPS[setup]
    return pool_layout(hardware(hw.lower()), 1, [model_arch(model)], EngineSettings()).kv_bytes


def capacity_tokens(setup: str) -> float:
    return kv_capacity(setup) / model_arch(SETUPS[setup][1]).kv_bytes_per_token


def load_scale(setup: str) -> float:
    """The setup's KV capacity in tokens relative to the reference setup's (rates scale with it)."""
    return capacity_tokens(setup) / capacity_tokens(REF_SETUP)


def trace_rate() -> float:
    tr = C.conv_trace()
    return len(tr) / tr.duration_s


def truncate(pairs: np.ndarray) -> np.ndarray:
    """(prompt, output) pairs within the context: output ≤ ctx − 1 first, then prompt ≤ ctx − output."""
    out = np.minimum(pairs[:, 1], CONTEXT - 1)
    prompt = np.maximum(1, np.minimum(pairs[:, 0], CONTEXT - out))
    return np.stack([prompt, out], axis=1)


@lru_cache(maxsize=2)
def alpaca_pairs(scale: int) -> np.ndarray:
    return truncate(np.array(alpaca_lengths(C.ALPACA), dtype=np.int64) * scale)


@lru_cache(maxsize=1)
def conv_pairs() -> np.ndarray:
    return truncate(C.trace_lengths())


def multiple(setup: str, level: str) -> float:
    """The level's multiple of the trace's mean rate for ``setup`` (capacity-scaled)."""
    return LEVELS[level] * load_scale(setup)


@lru_cache(maxsize=8)
def workload(setup: str, kind: str, level: str, horizon_s: float) -> Workload:
    rate = multiple(setup, level) * trace_rate()
    if kind == "conv-poisson":
        return C.poisson_workload(conv_pairs(), rate, horizon_s, seed=1)
    if kind == "alpaca10-poisson":
        return C.poisson_workload(alpaca_pairs(10), rate, horizon_s, seed=2)
    if kind == "alpaca-poisson":
        return C.poisson_workload(alpaca_pairs(1), rate, horizon_s, seed=3)
    if kind == "conv-trace":
        w = C.rescaled(C.conv_trace(), multiple(setup, level), horizon_s)
        p = truncate(np.array(w.lengths(), dtype=np.int64))
        return Workload(
            tuple(
                dataclasses.replace(r, prompt_tokens=int(a), output_tokens=int(b))
                for r, (a, b) in zip(w.requests, p.tolist(), strict=True)
            )
        )
    raise ValueError(f"unknown workload {kind!r}")


def workloads(cfg: dict) -> list[tuple[str, str]]:
    """(kind, level) pairs run on every setup."""
    out = [(k, lv) for k in ("conv-poisson", "conv-trace", "alpaca10-poisson") for lv in cfg["levels"]]
    if cfg["alpaca_control"]:
        out.append(("alpaca-poisson", "mid"))
    return out


# ------------------------------------------------------------------------------------------------ run
def step_mean(ts: list[float], values: list[float], end_s: float) -> float:
    """Time-weighted mean of the step function (ts, values) up to ``end_s`` (as the simulator's
    ``mean_active_gpus``)."""
    if not ts:
        return 0.0
    area = total = 0.0
    for i, (t, v) in enumerate(zip(ts, values, strict=True)):
        t1 = ts[i + 1] if i + 1 < len(ts) else max(end_s, t)
        area += v * (t1 - t)
        total += t1 - t
    return area / total if total > 0 else float(values[-1])


def run_one(job: tuple[str, str, str, str, float, int]) -> dict:
    """One simulation: (setup, workload kind, level, variant, horizon, samples) → its row."""
    setup, kind, level, variant, horizon_s, samples = job
    hw, model, _ = SETUPS[setup]
    spec = SimSpec(ClusterSpec.parse(f"{GPUS}x{hw}"), (SimService("chat", model, max_tokens=CONTEXT),))
    wl = workload(setup, kind, level, horizon_s)
    t0 = time.perf_counter()
    e = simulate(spec, wl, bundle(variant), samples=samples)
    wall = time.perf_counter() - t0
    m = C.metrics(e)
    cl = e.report["cluster"]
    mig = e.report.get("migration") or {}
    recs = e.result.records
    start = min(r.arrival_s for r in recs)
    end = max((r.finish_s for r in recs if r.done), default=start)
    ts = [s.t for s in e.result.samples]
    active = [s.active_gpus for s in e.result.samples]
    fluid = [s.fluid_gpus for s in e.result.samples]
    fluid_peak = max(fluid, default=0)
    fluid_mean = step_mean(ts, fluid, end)
    n = len(wl)
    row: dict[str, Any] = {
        "setup": setup,
        "workload": kind,
        "level": level,
        "rate_rps": n / horizon_s,
        "trace_multiple": multiple(setup, level),
        "variant": variant,
        "requests": n,
        "completed": m["completed"],
        "failed": m["failed"],
        "peak_active": cl["peak_active_gpus"],
        "mean_active": cl["mean_active_gpus"],
        "fluid_peak": fluid_peak,
        "fluid_mean": fluid_mean,
        "fluid_bound_report": cl["fluid_bound_gpus"],
        "at_cluster_size": cl["peak_active_gpus"] >= GPUS,
        "peak_over_fluid": C.ratio(cl["peak_active_gpus"], fluid_peak),
        "mean_over_fluid": C.ratio(cl["mean_active_gpus"], fluid_mean),
        "mem_util": cl["active_kv_utilization_mean"],  # KV in use / KV capacity of the active GPUs
        "mem_util_weights": cl["active_memory_utilization_mean"],  # (weights + KV) / GPU memory (paper)
        "kv_util_mean": cl["kv_utilization_mean"],
        "active_gpu_s": cl["mean_active_gpus"] * (end - start),
        "latency_mean_s": m["latency_mean_s"],
        "latency_p99_s": m["latency_p99_s"],
        "ttft_mean_s": m["ttft_mean_s"],
        "tpot_mean_ms": m["tpot_mean_ms"],
        "makespan_s": m["makespan_s"],
        "preemptions": m["preemptions"],
        "migrations": mig.get("executed", 0),
        "migrations_per_req": mig.get("executed", 0) / n,
        "planned": mig.get("planned", 0),
        "operations": mig.get("operations", 0),
        "cancelled": mig.get("cancelled", 0),
        "deferred": mig.get("deferred", 0),
        "skipped": mig.get("skipped", 0),
        "kv_moves": mig.get("kv_moves", 0),
        "token_moves": mig.get("token_moves", 0),
        "kv_gb_moved": mig.get("kv_bytes_moved", 0) / 1e9,
        "transfer_s_total": mig.get("transfer_s_total", 0.0),
        "reprefill_tokens": mig.get("reprefill_tokens", 0),
        "max_per_epoch": mig.get("max_per_epoch", 0),
        "sim_wall_s": wall,
        "_series": {"t": ts, "active": active, "fluid": fluid},
    }
    return row


def run_all(jobs: list[tuple], processes: int, log) -> list[dict]:
    """Every job once, in ``processes`` workers (heaviest first); rows in job order."""
    order = sorted(range(len(jobs)), key=lambda i: -_weight(jobs[i]))
    rows: list[dict | None] = [None] * len(jobs)
    if processes <= 1:
        for i in order:
            rows[i] = run_one(jobs[i])
            _log_row(rows[i], log)
    else:
        with ProcessPoolExecutor(processes, mp_context=mp.get_context("fork")) as pool:
            futs = {i: pool.submit(run_one, jobs[i]) for i in order}
            for i in order:
                rows[i] = futs[i].result()
                _log_row(rows[i], log)
    return [r for r in rows if r is not None]


def _weight(job: tuple) -> float:
    setup, kind, level, variant, horizon_s, _ = job
    w = LEVELS[level] * load_scale(setup) * horizon_s
    return w * (2.0 if variant.startswith("Mell") else 1.0) * (0.3 if kind == "alpaca-poisson" else 1.0)


def _log_row(r: dict, log) -> None:
    log(
        f"  {r['setup']:8s} {r['workload']:16s} {r['level']:4s} {r['variant']:12s} "
        f"peak {r['peak_active']:>2} mean {r['mean_active']:5.2f} fluid {r['fluid_peak']:>2}/{r['fluid_mean']:5.2f} "
        f"util {r['mem_util']:.2f} mig/req {r['migrations_per_req']:.2f} p99 {r['latency_p99_s']:6.1f}s "
        f"failed {r['failed']} ({r['sim_wall_s']:.1f} s)"
    )


# ------------------------------------------------------------------------------------------- sections
def key(r: dict) -> tuple[str, str, str]:
    return r["setup"], r["workload"], r["level"]


def pick(rows: list[dict], k: tuple, variant: str) -> dict | None:
    return next((r for r in rows if key(r) == k and r["variant"] == variant), None)


def saving(mell: float, base: float) -> float | None:
    """Mell's GPU saving vs a baseline: 1 − mell / base."""
    r = C.ratio(mell, base)
    return None if r is None else 1.0 - r


def headline_section(rows: list[dict], cfg: dict) -> dict:
    runs = [r for r in rows if r["variant"] in HEADLINE]
    keys = list(dict.fromkeys(key(r) for r in runs))
    savings = []
    for k in keys:
        s: dict[str, Any] = {"setup": k[0], "workload": k[1], "level": k[2]}
        for v in MELLS:
            m = pick(runs, k, v)
            if m is None:
                continue
            for b in BASELINES:
                x = pick(runs, k, b)
                if x is not None:
                    s[f"peak_vs_{b}{_sfx(v)}"] = saving(m["peak_active"], x["peak_active"])
                    s[f"mean_vs_{b}{_sfx(v)}"] = saving(m["mean_active"], x["mean_active"])
        if len(s) > 3:
            savings.append(s)
    goals: dict[str, Any] = {}
    for v in MELLS:
        if any(r["variant"] == v for r in runs):
            goals.update({f"{g}{_sfx(v)}": x for g, x in _goals(runs, savings, v).items()})
    return {"setup": _setup_info(cfg), "rows": runs, "savings": savings, "goals": goals}


def _sfx(variant: str) -> str:
    """Key suffix of a Mell variant's savings and goals: "" for the paper's Mell, "_plus" for Mell+,
    "_plusplus" for Mell++."""
    return {"Mell": "", "Mell+": "_plus", "Mell++": "_plusplus"}[variant]


def _goals(runs: list[dict], savings: list[dict], variant: str) -> dict[str, dict]:
    """The paper's goals for one Mell variant, on the KV-bound workloads."""
    sfx = _sfx(variant)
    mell = [r for r in runs if r["variant"] == variant and r["workload"] not in CONTROLS]
    kv_bound = [s for s in savings if s["workload"] not in CONTROLS]
    within = [r for r in mell if r["peak_over_fluid"] is not None and r["peak_over_fluid"] <= 1.10]
    worst_pf = max((r["peak_over_fluid"] for r in mell if r["peak_over_fluid"] is not None), default=None)
    mem = [r["mem_util_weights"] for r in mell]
    kvu = [r["mem_util"] for r in mell]
    theorem = [r for r in mell if r["peak_active"] <= THEOREM_RATIO * r["fluid_peak"] + THEOREM_ADDITIVE]
    ranges = {}
    for b in BASELINES:
        for what in ("peak", "mean"):
            x = [s[f"{what}_vs_{b}{sfx}"] for s in kv_bound if s.get(f"{what}_vs_{b}{sfx}") is not None]
            ranges[f"{what}_vs_{b}"] = [min(x), max(x)] if x else None
    peak_savings = [
        s[f"peak_vs_{b}{sfx}"] for s in kv_bound for b in BASELINES if s.get(f"peak_vs_{b}{sfx}") is not None
    ]
    return {
        "fluid": {
            "text": f"{variant}: peak active GPUs ≤ 1.10 × the fluid bound (peak of Σ⌈KV/C⌉ in the same run; "
            "KV-bound workloads)",
            "ours_text": f"worst {C.fmt(worst_pf)}×; within 1.10× in {len(within)}/{len(mell)} runs",
            "worst": worst_pf,
            "met_runs": len(within),
            "runs": len(mell),
            "met": bool(mell) and len(within) == len(mell),
        },
        "theorem": {
            "text": f"{variant}: peak active GPUs ≤ 4/3 × fluid bound + {THEOREM_ADDITIVE} (Theorem 2's ratio and "
            "additive constant; KV-bound workloads)",
            "ours_text": f"holds in {len(theorem)}/{len(mell)} runs",
            "met_runs": len(theorem),
            "runs": len(mell),
            "met": bool(mell) and len(theorem) == len(mell),
        },
        "util": {
            "text": f"{variant}: mean KV utilization of active GPUs ≥ 88 % (KV in use / C, C = the KV capacity of a "
            "GPU as the paper defines it; lowest average 88 %; KV-bound workloads)",
            "ours_text": f"KV in use / C: min {C.fmt(min(kvu, default=None), '.3f')}, "
            f"max {C.fmt(max(kvu, default=None), '.3f')}, ≥ 0.88 in {sum(u >= 0.88 for u in kvu)}/{len(kvu)} runs; "
            f"beside it, (weights + KV) / memory: min {C.fmt(min(mem, default=None), '.3f')}, "
            f"max {C.fmt(max(mem, default=None), '.3f')}",
            "min": min(kvu, default=None),
            "min_weights": min(mem, default=None),
            "met": bool(kvu) and min(kvu) >= 0.88,
        },
        "savings": {
            "text": f"{variant} needs 9–31 % fewer GPUs than BF, WF and LB (paper; here: peak active GPUs, every "
            "KV-bound run and baseline ≥ 9 %)",
            "ours_text": "peak saving "
            + ", ".join(f"vs {b} {_pct_range(ranges[f'peak_vs_{b}'])}" for b in BASELINES)
            + "; mean saving "
            + ", ".join(f"vs {b} {_pct_range(ranges[f'mean_vs_{b}'])}" for b in BASELINES),
            "ranges": ranges,
            "met": bool(peak_savings) and min(peak_savings) >= 0.09,
        },
    }


def batching_section(rows: list[dict], cfg: dict) -> dict:
    keys = list(dict.fromkeys(key(r) for r in rows))
    out = []
    for k in keys:
        on, off = pick(rows, k, "Mell"), pick(rows, k, "Mell-nobatch")
        if on is None or off is None:
            continue
        out.append({
            "setup": k[0], "workload": k[1], "level": k[2],
            "mig_per_req_on": on["migrations_per_req"], "mig_per_req_off": off["migrations_per_req"],
            "planned_on": on["planned"], "planned_off": off["planned"],
            "cancelled_on": on["cancelled"], "cancelled_off": off["cancelled"],
            "reduction": saving(on["migrations"], off["migrations"]),
            "planned_reduction": saving(on["planned"], off["planned"]),
            "peak_on": on["peak_active"], "peak_off": off["peak_active"],
            "mean_on": on["mean_active"], "mean_off": off["mean_active"],
            "p99_on": on["latency_p99_s"], "p99_off": off["latency_p99_s"],
        })  # fmt: skip
    red = [x["reduction"] for x in out if x["reduction"] is not None and x["workload"] not in CONTROLS]
    goal = {
        "text": "operation batching cuts Mell's executed migrations (paper: up to 30 %; KV-bound workloads)",
        "ours_text": f"reduction {_pct_range([min(red), max(red)] if red else None)} "
        f"(cuts in {sum(r > 0 for r in red)}/{len(red)} runs)",
        "max": max(red, default=None),
        "min": min(red, default=None),
        "met": bool(red) and min(red) > 0,
    }
    return {"setup": _setup_info(cfg), "rows": out, "goal": goal}


def transfer_section(rows: list[dict], cfg: dict) -> dict:
    keys = list(dict.fromkeys(key(r) for r in rows))
    out = []
    for k in keys:
        hyb = pick(rows, k, "Mell")
        if hyb is None:
            continue
        for v in ("Mell-kv", "Mell-tokens", "Mell"):
            r = pick(rows, k, v)
            if r is None:
                continue
            out.append({
                "setup": k[0], "workload": k[1], "level": k[2],
                "transfer": {"Mell-kv": "kv", "Mell-tokens": "tokens", "Mell": "hybrid"}[v],
                **{f: r[f] for f in ("migrations", "kv_moves", "token_moves", "kv_gb_moved", "transfer_s_total",
                                     "reprefill_tokens", "deferred", "skipped", "latency_p99_s", "latency_mean_s",
                                     "tpot_mean_ms", "ttft_mean_s", "peak_active", "mean_active")},
                "tpot_vs_hybrid": C.ratio(r["tpot_mean_ms"], hyb["tpot_mean_ms"]),
                "latency_vs_hybrid": C.ratio(r["latency_mean_s"], hyb["latency_mean_s"]),
                "p99_vs_hybrid": C.ratio(r["latency_p99_s"], hyb["latency_p99_s"]),
            })  # fmt: skip
    return {"setup": _setup_info(cfg), "rows": out}


def _table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    """``C.md_table`` with columns given as (key, header, format)."""
    return C.md_table(rows, [(h, k, f) for k, h, f in cols])


def _pct_range(r: list[float] | None) -> str:
    if not r:
        return "–"
    return f"{100 * r[0]:.0f}…{100 * r[1]:.0f} %"


def _setup_info(cfg: dict) -> dict:
    return {
        "cluster": f"{GPUS} GPUs per setup, one model instance per GPU",
        "setups": {k: v[2] for k, v in SETUPS.items()},
        "kv_capacity_tokens": {k: round(capacity_tokens(k)) for k in SETUPS},
        "load_scale": {k: load_scale(k) for k in SETUPS},
        "levels": {lv: LEVELS[lv] for lv in cfg["levels"]},
        "trace_rate_rps": trace_rate(),
        "horizon_s": cfg["horizon_s"],
        "context_tokens": CONTEXT,
        "migration_epoch_s": 1.0,
        "cost": COST,
    }


# --------------------------------------------------------------------------------------------- report
def markdown(res: dict, command: str) -> str:
    lines = [
        "# Mell migration benchmark",
        "",
        f"Command (last invocation): `{command}`",
        "",
        f"Cost source: {COST}. {C.COST_NOTE}",
        "",
    ]
    info = next((res[s]["setup"] for s in SECTIONS if s in res), None)
    if info:
        lines += [
            f"- Cluster: {info['cluster']}; setups: "
            + "; ".join(
                f"`{k}` = {v} (C = {info['kv_capacity_tokens'][k]:,} tokens, rates × {info['load_scale'][k]:.3f})"
                for k, v in info["setups"].items()
            ),
            f"- Load levels (× the conv trace's {info['trace_rate_rps']:.2f} req/s, then × the setup's "
            f"rate factor): {', '.join(f'{k} {v:g}' for k, v in info['levels'].items())}; "
            f"{info['horizon_s']:g} s of arrivals per run; prompts/outputs ≤ {info['context_tokens']} tokens.",
            "- Active GPUs: GPUs holding requests (peak over the samples, time-weighted mean to the last "
            "finish); fluid bound: Σ⌈KV(t)/C⌉ of the same run (its peak and time-weighted mean).",
            "",
        ]
    if "headline" in res:
        h = res["headline"]
        lines += [
            "## 1. Headline: active GPUs (BF / WF / LB / Mell / Mell+ / Mell++)",
            "",
            "Beyond the paper: Mell+ = Mell with `fill_first` (before Allocate opens a GPU, the item goes to "
            "an active GPU of any type with room, best fit); Mell++ = Mell+ with `compact` (after the "
            "operations, each epoch, the GPU with the least KV whose items fit in the other GPUs' room, "
            "keeping 5 % of C free there, is emptied). `KV util`: KV in use / KV capacity of the active "
            "GPUs; `mem util`: the paper's GPU utilization, (weights + KV in use) / GPU memory of the active "
            "GPUs; both time-averaged over the samples with an active GPU.",
            "",
        ]
        for setup in SETUPS:
            rows = [r for r in h["rows"] if r["setup"] == setup]
            if not rows:
                continue
            lines += [f"### {SETUPS[setup][2]} ({GPUS} GPUs)", ""]
            lines += [_table(rows, [
                ("workload", "workload", ""), ("level", "level", ""), ("rate_rps", "req/s", ".1f"),
                ("variant", "policy", ""), ("peak_active", "peak", ""), ("mean_active", "mean", ".2f"),
                ("fluid_peak", "fluid peak", ""), ("fluid_mean", "fluid mean", ".2f"),
                ("peak_over_fluid", "peak/fluid", ".2f"), ("mean_over_fluid", "mean/fluid", ".2f"),
                ("mem_util", "KV util", ".3f"), ("mem_util_weights", "mem util", ".3f"),
                ("migrations_per_req", "mig/req", ".2f"),
                ("latency_p99_s", "p99 (s)", ".1f"), ("tpot_mean_ms", "TPOT (ms)", ".1f"),
                ("failed", "failed", ""),
            ]), ""]  # fmt: skip
        for v in MELLS:
            cols = [("setup", "setup", ""), ("workload", "workload", ""), ("level", "level", "")]
            for b in BASELINES:
                cols += [(f"peak_vs_{b}{_sfx(v)}", f"peak vs {b}", ".1%"),
                         (f"mean_vs_{b}{_sfx(v)}", f"mean vs {b}", ".1%")]  # fmt: skip
            if any(f"peak_vs_BF{_sfx(v)}" in s for s in h["savings"]):
                lines += [f"### {v}'s GPU saving vs each baseline (1 − {v} / baseline)", ""]
                lines += [_table(h["savings"], cols), ""]
        lines += [f"- {C.goal_line(g)}" for g in h["goals"].values()]
        capped = [r for r in h["rows"] if r.get("at_cluster_size") and r["variant"] not in ("WF", "LB")]
        lines += [
            f"- Runs other than WF/LB whose peak reached the cluster size ({GPUS}): "
            + (
                ", ".join(f"{r['setup']} {r['workload']} {r['level']} {r['variant']}" for r in capped)
                or "none"
            )
        ]
        lines += [""]
    if "batching" in res:
        b = res["batching"]
        lines += ["## 2. Operation batching (Mell, batching on vs off)", ""]
        lines += [_table(b["rows"], [
            ("setup", "setup", ""), ("workload", "workload", ""), ("level", "level", ""),
            ("mig_per_req_on", "mig/req on", ".3f"), ("mig_per_req_off", "mig/req off", ".3f"),
            ("reduction", "reduction", ".1%"), ("planned_reduction", "planned red.", ".1%"),
            ("cancelled_on", "cancelled", ""), ("peak_on", "peak on", ""), ("peak_off", "peak off", ""),
            ("mean_on", "mean on", ".2f"), ("mean_off", "mean off", ".2f"),
            ("p99_on", "p99 on (s)", ".1f"), ("p99_off", "p99 off (s)", ".1f"),
        ]), ""]  # fmt: skip
        lines += [f"- {C.goal_line(b['goal'])}", ""]
    if "transfer" in res:
        t = res["transfer"]
        lines += ["## 3. Transfer: KV only, tokens only (re-prefill), hybrid", ""]
        lines += [_table(t["rows"], [
            ("setup", "setup", ""), ("workload", "workload", ""), ("level", "level", ""),
            ("transfer", "transfer", ""), ("migrations", "moves", ""), ("kv_moves", "KV moves", ""),
            ("token_moves", "token moves", ""), ("transfer_s_total", "KV transfer (s)", ".1f"),
            ("reprefill_tokens", "re-prefill tok", ""), ("deferred", "deferred", ""),
            ("latency_p99_s", "p99 (s)", ".1f"), ("tpot_mean_ms", "TPOT (ms)", ".2f"),
            ("tpot_vs_hybrid", "TPOT/hybrid", ".3f"), ("latency_vs_hybrid", "latency/hybrid", ".3f"),
            ("peak_active", "peak", ""), ("mean_active", "mean", ".2f"),
        ]), ""]  # fmt: skip
    if res.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in res["notes"]] + [""]
    lines += [f"Wall time: {res['wall_s']:.0f} s for the last invocation ({res.get('simulations', 0)} simulations in "
              f"{res.get('processes', 1)} processes). The sections above come from:", ""]  # fmt: skip
    lines += [f"- {k}: `{v['command']}` — {v['simulations']} simulations, {v['wall_s']:.0f} s"
              for k, v in res.get("invocations", {}).items()]  # fmt: skip
    lines += [""]
    return "\n".join(lines)


NOTES = [
    "WF and LB use `worst_fit_kv` with `active_only=True`: among the active GPUs (holding KV or queued "
    "prompts) the one with the most free KV that holds the request's prompt KV; an idle GPU is activated only "
    "when no active one fits (the paper's 'activate a new GPU if no GPU can handle an incoming request'). "
    "LB's balancing moves requests between active GPUs only; it never activates or deactivates one.",
    "BF dispatches by the prompt's KV (no output prediction): it packs arrivals onto nearly full GPUs, where "
    "requests then wait or are preempted as their KV grows; few active GPUs come with a long queue "
    "(see p99 and TPOT) and with a lower fluid bound (queued requests hold no KV).",
    "The fluid bound is that of each run: it depends on the policy (a packed GPU decodes slower, so requests "
    "hold their KV longer; queued requests hold none).",
    "Dispatchers see an engine's queued prompts as promised KV (`EngineCandidate.kv_waiting_bytes`); a move "
    "of a request still queued carries no KV and is counted as `queued_moves`.",
    "The computation boundary of hybrid transfer is the marginal cost of re-prefill tokens fused into a "
    "decode iteration (the cost model's iteration time with and without them), within 10 % of that "
    "iteration, times the iterations in the epoch.",
    "Goals are evaluated on the KV-bound workloads; the raw-Alpaca control (`alpaca-poisson`) is reported "
    "but left out (one GPU's batch cap, not its KV, binds there).",
]


def plot(res: dict, out: Path, series: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    if series:
        fig, ax = plt.subplots(figsize=(7.5, 3.8))
        for v in HEADLINE:
            s = series.get(v)
            if s:
                ax.step(s["t"], s["active"], where="post", label=v, lw=1.2)
        s = series.get("Mell")
        if s:
            ax.step(
                s["t"], s["fluid"], where="post", color="k", ls="--", lw=1.0, label="fluid bound (Mell run)"
            )
        meta = series.get("_meta", {})
        ax.set_xlabel("time (s)")
        ax.set_ylabel("active GPUs")
        ax.set_title(f"Active GPUs over time: {meta.get('title', '')}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out / "migration_active_gpus.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    if "headline" in res:
        rows = res["headline"]["rows"]
        setups = [s for s in SETUPS if any(r["setup"] == s for r in rows)]
        fig, axes = plt.subplots(1, len(setups), figsize=(5.5 * len(setups), 4.0), squeeze=False)
        for ax, setup in zip(axes[0], setups, strict=True):
            rs = [r for r in rows if r["setup"] == setup]
            groups = list(dict.fromkeys((r["workload"], r["level"]) for r in rs))
            width = 0.8 / len(HEADLINE)
            mid = (len(HEADLINE) - 1) / 2
            for j, v in enumerate(HEADLINE):
                ys = [next((r["mean_active"] for r in rs if (r["workload"], r["level"]) == g and r["variant"] == v), 0)
                      for g in groups]  # fmt: skip
                ax.bar([i + (j - mid) * width for i in range(len(groups))], ys, width, label=v)
            fl = [next((r["fluid_mean"] for r in rs if (r["workload"], r["level"]) == g and r["variant"] == "Mell"), 0)
                  for g in groups]  # fmt: skip
            ax.scatter(
                [i + (HEADLINE.index("Mell") - mid) * width for i in range(len(groups))],
                fl,
                marker="_",
                s=150,
                color="k",
                zorder=3,
                label="fluid mean (Mell run)",
            )
            ax.set_xticks(range(len(groups)))
            ax.set_xticklabels([f"{w}\n{lv}" for w, lv in groups], fontsize=6, rotation=45, ha="right")
            ax.set_ylabel("mean active GPUs")
            ax.set_title(SETUPS[setup][2], fontsize=9)
            ax.grid(alpha=0.3, axis="y")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=7)
        fig.tight_layout(rect=(0, 0, 1, 0.93))
        p = out / "migration_mean_active.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


# ----------------------------------------------------------------------------------------------- main
def settings(quick: bool) -> dict:
    if quick:
        return {"levels": ("mid",), "horizon_s": 60.0, "alpaca_control": False, "samples": 400}
    return {"levels": ("low", "mid", "high"), "horizon_s": 180.0, "alpaca_control": True, "samples": 400}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(".bench/migration"))
    ap.add_argument("--quick", action="store_true", help="the mid load only, 60 s of arrivals")
    ap.add_argument("--only", action="append", choices=SECTIONS, help="run only this section (repeatable)")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--trace", type=Path, default=None, help=f"Azure conv trace CSV (default {C.TRACE})")
    ap.add_argument("--alpaca", type=Path, default=None, help=f"Alpaca JSON (default {C.ALPACA})")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    if args.trace:
        C.TRACE = args.trace
    if args.alpaca:
        C.ALPACA = args.alpaca
    cfg = settings(args.quick)
    only = [s for s in SECTIONS if s in set(args.only or SECTIONS)]
    setups = list(SETUPS)
    variants = list(dict.fromkeys(v for s in only for v in SECTION_VARIANTS[s]))
    jobs = [
        (setup, kind, level, v, cfg["horizon_s"], cfg["samples"])
        for setup in setups
        for kind, level in workloads(cfg)
        for v in variants
    ]
    print(f"{len(jobs)} simulations ({', '.join(only)}) in {args.processes} processes")
    t0 = time.perf_counter()
    rows = run_all(jobs, args.processes, print)
    wall = time.perf_counter() - t0
    # the time series of the representative run (the highest level of PLOT_RUN), before dropping them
    top = cfg["levels"][-1]
    series: dict[str, Any] = {}
    for r in rows:
        s = r.pop("_series")
        here = (r["setup"], r["workload"], r["level"]) == (*PLOT_RUN, top)
        if here and "headline" in only and r["variant"] in HEADLINE:
            series[r["variant"]] = s
    if series:
        series["_meta"] = {"title": f"{SETUPS[PLOT_RUN[0]][2]}, {PLOT_RUN[1]} {top} (paper Fig. 15)",
                           "setup": PLOT_RUN[0], "workload": PLOT_RUN[1], "level": top}  # fmt: skip
    res: dict[str, Any] = {}
    builders = {"headline": headline_section, "batching": batching_section, "transfer": transfer_section}
    for s in only:
        res[s] = builders[s](rows, cfg)
        res[s]["settings"] = {**cfg, "levels": list(cfg["levels"]), "setups": setups}
    if series:
        res["series"] = series
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "migration.json"
    prev = json.loads(path.read_text()) if path.exists() and args.only else {}
    py = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else sys.executable
    command = " ".join([py, "tools/bench/migration_bench.py", *(argv if argv is not None else sys.argv[1:])])
    runs = {
        **prev.get("invocations", {}),
        ", ".join(only): {"command": command, "wall_s": wall, "simulations": len(jobs)},
    }
    res = {**prev, **res}
    res["invocations"] = runs
    res["wall_s"] = wall
    res["simulations"] = len(jobs)
    res["processes"] = args.processes
    res["quick"] = args.quick
    res["notes"] = NOTES
    res["command"] = command
    path.write_text(json.dumps(res, indent=1, default=str))
    (args.out / "migration.md").write_text(markdown(res, command))
    if not args.no_plots:
        plot(res, args.out, res.get("series", {}))
    print(f"wrote {args.out}/migration.json, migration.md ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
