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
  ``fleet`` = 3 × ``mid`` (30 × the trace's rate), the load at which A100-7B holds at least 40 active
  GPUs, runs on 96 GPUs per setup; ``papers/mell.py`` (``make bench-papers``) runs it, this bench keeps
  the three paper levels.
- Workloads (prompts and outputs truncated to Llama-2's 4,096-token context, the output first):

  * ``conv-poisson``: conv-trace (prompt, output) lengths, Poisson arrivals at each level (the paper's
    Poisson workloads);
  * ``conv-trace``: the trace's own arrivals and lengths, its first ``horizon × scale`` seconds replayed
    ``scale`` × faster (the paper's Azure-trace workload; scale = the level's multiple);
  * ``alpaca10-poisson``: Alpaca lengths × 10, Poisson at each level. The paper scales its chat
    conversations (LMSYS-Chat, WildChat: short prompts, few hundred output tokens) ten-fold to mimic
    long-context models; Alpaca × 10 (mean 205 + 670 tokens) is the closest such workload here. The
    conv trace is not scaled: its mean prompt is already 1,155 tokens, ×10 would truncate nearly all;
  * ``conv-x4``: the long-context workload: the conv trace's lengths × 4 (mean prompt ~4.6k tokens), not
    cut to Llama-2's context, only to fit one GPU's KV (output first), Poisson at the rate that gives
    the same KV demand (rate × mean output × (prompt + output / 2)) as ``conv-poisson`` at the level;
    its requests reach the S, M and L classes, where Mell's types matter (run by ``papers/mell.py``);
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
   their ratios to the fluid bound of the same run (Σ⌈KV(t)/C⌉: peak/peak, mean/mean), over the steady
   window (``steady_window``: the arrivals' window without its first quarter, the drain left out) the
   mean active GPUs, KV in use / C and (weights + KV) / memory with its ceiling (a full KV pool,
   ``weights_ceiling``), Mell's GPU openings by cause (``MellPacker.counters``), mean KV
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

# The parts: migration_bench_setup (setups, loads, workloads, policy variants), migration_bench_sections
# (the sections from the rows), migration_bench_report (markdown and PNGs); this file runs the simulations.
import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from llmfleet.sim.run import simulate
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec

from tools.bench.migration_bench_report import NOTES, markdown, plot
from tools.bench.migration_bench_sections import (
    batching_section,
    headline_section,
    key,
    pick,
    saving,
    transfer_section,
)
from tools.bench.migration_bench_setup import (
    BASELINES,
    CONTEXT,
    CONTROLS,
    COST,
    FLEET_GPUS,
    GPUS,
    HEADLINE,
    LEVELS,
    MELLS,
    PLOT_RUN,
    REF_SETUP,
    SECTION_VARIANTS,
    SECTIONS,
    SETUPS,
    STEADY_SKIP,
    THEOREM_ADDITIVE,
    THEOREM_RATIO,
    WF_OPTIONS,
    C,
    alpaca_pairs,
    bundle,
    capacity_tokens,
    cluster_gpus,
    conv_pairs,
    kv_capacity,
    load_scale,
    multiple,
    setup_info,
    steady_window,
    trace_rate,
    truncate,
    weights_ceiling,
    workload,
    workloads,
)

__all__ = [  # what papers/mell.py and older callers read from this module
    "BASELINES",
    "CONTEXT",
    "CONTROLS",
    "COST",
    "FLEET_GPUS",
    "GPUS",
    "HEADLINE",
    "LEVELS",
    "MELLS",
    "NOTES",
    "PLOT_RUN",
    "REF_SETUP",
    "SECTIONS",
    "SECTION_VARIANTS",
    "SETUPS",
    "STEADY_SKIP",
    "THEOREM_ADDITIVE",
    "THEOREM_RATIO",
    "WF_OPTIONS",
    "C",
    "alpaca_pairs",
    "batching_section",
    "bundle",
    "capacity_tokens",
    "cluster_gpus",
    "conv_pairs",
    "headline_section",
    "job_weight",
    "key",
    "kv_capacity",
    "load_scale",
    "markdown",
    "multiple",
    "pick",
    "plot",
    "run_all",
    "run_one",
    "saving",
    "settings",
    "setup_info",
    "simulate",
    "steady_means",
    "steady_window",
    "step_mean",
    "trace_rate",
    "transfer_section",
    "truncate",
    "weights_ceiling",
    "workload",
    "workloads",
]


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


def steady_means(samples: list, start_s: float, end_s: float) -> dict[str, float | None]:
    """Means over the samples in [start_s, end_s] (evenly spaced, so plain means are time means): KV
    in use / C of the GPUs holding requests (``steady_kv_util``), the weights-included reading
    (``steady_mem_util``), active GPUs and the fluid bound; None without a sample there."""
    win = [s for s in samples if start_s <= s.t <= end_s]
    act = [s for s in win if s.active_kv_capacity]

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {
        "steady_start_s": start_s,
        "steady_end_s": end_s,
        "steady_samples": len(win),
        "steady_kv_util": mean([s.kv_used / s.active_kv_capacity for s in act]),
        "steady_mem_util": mean(
            [s.active_mem_used / s.active_mem_capacity for s in act if s.active_mem_capacity]
        ),
        "steady_active": mean([float(s.active_gpus) for s in win]),
        "steady_fluid": mean([float(s.fluid_gpus) for s in win]),
    }


def run_one(job: tuple[str, str, str, str, float, int], cost_source: str | None = None) -> dict:
    """One simulation: (setup, workload kind, level, variant, horizon, samples) → its row;
    ``cost_source``: the simulator's (default: ``SimSpec``'s)."""
    setup, kind, level, variant, horizon_s, samples = job
    hw, model, _ = SETUPS[setup]
    gpus = cluster_gpus(level)
    max_tokens = int(capacity_tokens(setup)) if kind == "conv-x4" else CONTEXT
    spec = SimSpec(ClusterSpec.parse(f"{gpus}x{hw}"), (SimService("chat", model, max_tokens=max_tokens),))
    if cost_source is not None:
        spec = dataclasses.replace(spec, cost_source=cost_source)
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
    arrivals = [r.arrival_s for r in wl.requests]
    steady = steady_means(e.result.samples, *steady_window(min(arrivals), max(arrivals)))
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
        "at_cluster_size": cl["peak_active_gpus"] >= gpus,
        **steady,
        "weights_ceiling": weights_ceiling(setup),
        "openings": mig.get("policy_counters", {}),
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
    order = sorted(range(len(jobs)), key=lambda i: -job_weight(jobs[i]))
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


def job_weight(job: tuple) -> float:
    """A job's relative cost (for the order of the pool): arrivals × horizon, Mell's packer × 2, the
    workloads with fewer requests (raw Alpaca, conv × 4) × 0.3."""
    setup, kind, level, variant, horizon_s, _ = job
    w = LEVELS[level] * load_scale(setup) * horizon_s
    few = kind in ("alpaca-poisson", "conv-x4")
    return w * (2.0 if variant.startswith("Mell") else 1.0) * (0.3 if few else 1.0)


def _log_row(r: dict, log) -> None:
    log(
        f"  {r['setup']:8s} {r['workload']:16s} {r['level']:4s} {r['variant']:12s} "
        f"peak {r['peak_active']:>2} mean {r['mean_active']:5.2f} fluid {r['fluid_peak']:>2}/{r['fluid_mean']:5.2f} "
        f"util {r['mem_util']:.2f} mig/req {r['migrations_per_req']:.2f} p99 {r['latency_p99_s']:6.1f}s "
        f"failed {r['failed']} ({r['sim_wall_s']:.1f} s)"
    )


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
    command = " ".join(
        [py, "-m", "tools.bench.migration_bench", *(argv if argv is not None else sys.argv[1:])]
    )
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
