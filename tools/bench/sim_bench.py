"""Simulator performance: wall time, simulated events per second and peak memory per scenario.

Scenarios (each in its own process so the peak RSS is its own):
- ``conv32``:  the Azure conv trace (19,366 requests, 1 h window as published) on 32 A100-80GB,
               Llama-2-7B, for several policy presets (goal: ≤ 5 s wall each)
- ``synth1m``: 1,000,000 Poisson requests (lengths resampled from the conv trace) on 1,000 A100-80GB,
               FCFS + round-robin (goal: ≤ 120 s wall), once in one process and once split across
               ``--workers`` processes (exact: round robin is load-blind, see llmfleet.sim.partition)

    python -m tools.bench.sim_bench --out .bench            # everything
    python -m tools.bench.sim_bench --only conv32 --out .bench
Writes ``sim.json`` and ``sim.md`` (and ``sim.png``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from llmfleet.sim.partition import auto_workers
from llmfleet.sim.run import preset, simulate
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.types import Slo
from llmfleet.workload import Workload, WorkloadRequest, load_azure_trace, poisson

TRACE = Path(__file__).resolve().parents[2].parent / "shared/traces/azure_llm_2023_conv.csv"
CONV_POLICIES = ("vllm", "fcfs-jsq", "seallm", "sls")


def _lengths(trace: Path) -> list[tuple[int, int]]:
    return [(r.prompt_tokens, r.output_tokens) for r in load_azure_trace(trace).requests]


def scenario(name: str, trace: Path, policy: str, n: int, gpus: int, rate: float, workers: int = 1) -> dict:
    """Run one scenario in this process; the result row (without memory)."""
    import numpy as np

    t0 = time.perf_counter()
    if name == "conv32":
        wl = load_azure_trace(trace, service="chat")
    else:
        lengths = _lengths(trace)
        rng = np.random.default_rng(0)
        pick = rng.integers(0, len(lengths), size=n)
        times = poisson(rate, n=n, seed=0)
        wl = Workload(tuple(
            WorkloadRequest(f"s{i}", float(t), lengths[j][0], lengths[j][1], "chat")
            for i, (t, j) in enumerate(zip(times.tolist(), pick.tolist(), strict=True))
        ))  # fmt: skip
    load_s = time.perf_counter() - t0
    spec = SimSpec(
        ClusterSpec.parse(f"{gpus}xA100-80GB"),
        (SimService("chat", "llama2-7b", Slo(ttft_s=0.4, tpot_s=0.015)),),
    )
    e = simulate(spec, wl, preset(policy), samples=200, workers=workers)
    c, o = e.report["cluster"], e.report["overall"]
    return {
        "scenario": name,
        "policy": policy,
        "workers": e.result.workers,
        "requests": len(wl),
        "gpus": gpus,
        "instances": len(e.plan),
        "simulated_s": c["makespan_s"],
        "load_s": load_s,
        "wall_s": e.result.wall_s,
        "events": e.result.events,
        "events_per_s": c["events_per_s"],
        "iterations": c["iterations"],
        "iterations_per_s": c["iterations"] / e.result.wall_s,
        "completed": o["completed"],
        "latency_mean_s": o["latency_s"]["mean"],
        "latency_p99_s": o["latency_s"]["p99"],
        "cpu_s": time.process_time(),  # this process only (workers are children)
    }


def run_child(args: list[str]) -> dict:
    """Run this module on one scenario in a child process; its row plus the child's peak RSS."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.bench.sim_bench", "--child", *args], stdout=subprocess.PIPE, text=True
    )
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"scenario {args} failed (status {status})")
    row = json.loads(out.strip().splitlines()[-1])
    row["peak_rss_mib"] = usage.ru_maxrss / 1024  # Linux: KiB; the largest process (workers are forks)
    return row


GOALS = {"conv32": 5.0, "synth1m": 120.0}


def markdown(rows: list[dict]) -> str:
    lines = [
        "# Simulator performance",
        "",
        "| scenario | policy | workers | requests | GPUs | instances | simulated s | wall s | goal s | events/s | "
        "iterations/s | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['policy']} | {r['workers']} | {r['requests']:,} | {r['gpus']} | {r['instances']} | "
            f"{r['simulated_s']:.0f} | {r['wall_s']:.2f} | ≤ {GOALS[r['scenario']]:.0f} | {r['events_per_s']:,.0f} | "
            f"{r['iterations_per_s']:,.0f} | {r['peak_rss_mib']:.0f} |"
        )
    lines += [
        "",
        "Wall time excludes reading/generating the workload (`load_s` in the JSON). Rows with more than one "
        "worker split the instances across forked processes; their records equal the one-process run's. "
        "Peak RSS is the largest process's.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--out", type=Path, default=Path(".bench"))
    ap.add_argument("--only", choices=sorted(GOALS))
    ap.add_argument("--synth-requests", type=int, default=1_000_000)
    ap.add_argument("--synth-gpus", type=int, default=1000)
    ap.add_argument("--synth-rate", type=float, default=1000.0)  # 1 req/s per GPU
    ap.add_argument("--workers", type=int, default=0, help="processes for the split synth1m run (0: auto)")
    ap.add_argument("--skip-serial", action="store_true", help="skip the one-process synth1m run")
    ap.add_argument(
        "--child",
        nargs=7,
        metavar=("NAME", "TRACE", "POLICY", "N", "GPUS", "RATE", "WORKERS"),
        help=argparse.SUPPRESS,
    )
    a = ap.parse_args()
    if a.child:
        name, trace, policy, n, gpus, rate, workers = a.child
        print(json.dumps(scenario(name, Path(trace), policy, int(n), int(gpus), float(rate), int(workers))))
        return 0
    if not a.trace.exists():
        print(f"trace not found: {a.trace} (pass --trace)", file=sys.stderr)
        return 2
    rows = []
    if a.only in (None, "conv32"):
        for p in CONV_POLICIES:
            rows.append(run_child(["conv32", str(a.trace), p, "0", "32", "0", "1"]))
            print(f"conv32 {p}: {rows[-1]['wall_s']:.2f} s", file=sys.stderr)
    if a.only in (None, "synth1m"):
        split = a.workers or max(2, auto_workers(a.synth_requests))
        for workers in ([] if a.skip_serial else [1]) + [split]:
            args = [
                "synth1m",
                str(a.trace),
                "fcfs-rr",
                str(a.synth_requests),
                str(a.synth_gpus),
                str(a.synth_rate),
            ]
            rows.append(run_child([*args, str(workers)]))
            print(f"synth1m ({rows[-1]['workers']} workers): {rows[-1]['wall_s']:.2f} s", file=sys.stderr)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "sim.json").write_text(json.dumps({"rows": rows, "goals_wall_s": GOALS}, indent=1))
    (a.out / "sim.md").write_text(markdown(rows))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar([f"{r['scenario']}\n{r['policy']}×{r['workers']}" for r in rows], [r["wall_s"] for r in rows])
        ax.set_ylabel("wall seconds")
        ax.set_yscale("log")
        fig.tight_layout()
        fig.savefig(a.out / "sim.png", dpi=110)
    except ImportError:
        pass
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
