"""Where the client's TTFT goes on the emulated fleet: one ``llmfleet load`` of bench-prefix's multi-turn
workload on its fleet (``--quick``'s emulated section: 4 emulated A100-80GB, one setup at one load),
and from its report the client's TTFT, the engines' own, and the path between them in the report's
three parts (``live.path_parts_s``): client to scheduler and back, the scheduler choosing an engine,
and scheduler to engine and back (the hop and the first token's way back; the engine's TTFT counts
from its receipt of the request, its tokenizing included), each as mean and p50 in ms.

    .venv/bin/python -m tools.bench.path_split --rate 32 --runs 2 --out .bench/path-split
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tools.bench.fleet_common import Fleet, run_load
from tools.bench.prefix_bench import MAX_CONTEXT, MEAN_TURNS, SYSTEM_TOKENS, THINK_S
from tools.bench.prefix_bench_common import Conversations, Setup
from tools.bench.prefix_bench_sim import fleet_spec

PARTS = ("client_scheduler", "scheduler_dispatch", "scheduler_engine")


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """Mean and p50 (ms) of the client's TTFT, the engines' own, the path and its parts, of one
    ``llmfleet load`` report run."""
    live = report["live"]
    dists = {
        "client": report["overall"]["ttft_s"],
        "engine": live["engine_ttft_s"],
        "path": live["path_ttft_s"],
        **{p: live["path_parts_s"][p] for p in PARTS},
    }
    row: dict[str, Any] = {"requests": report["overall"]["ttft_s"]["n"], "timed": live["path_ttft_s"]["n"]}
    for name, d in dists.items():
        row[f"{name}_mean_ms"] = round(1e3 * d["mean"], 2) if d["n"] else None
        row[f"{name}_p50_ms"] = round(1e3 * d["p50"], 2) if d["n"] else None
    return row


def run(out: Path, gpus: int, setup: Setup, rate: float, span_s: float) -> dict[str, Any]:
    conv = Conversations(SYSTEM_TOKENS, MEAN_TURNS, THINK_S, MAX_CONTEXT, span_s)
    fleet = Fleet(out, fleet_spec(gpus, setup))
    fleet.start()
    try:
        load = run_load(fleet, conv.flags(rate), out / "live", conv.span_s * 8 + 900)
    finally:
        fleet.stop()
    if load.returncode != 0:
        raise RuntimeError(f"llmfleet load exited {load.returncode}: see {out / 'live.out'}")
    return figures(json.loads((out / "live" / "report.json").read_text())["runs"][0])


def markdown(rows: list[dict[str, Any]], context: str) -> str:
    names = ("client", "engine", "path", *PARTS)
    head = "| run | " + " | ".join(f"{n} mean / p50 ms" for n in names) + " |"
    lines = [f"# Where the client's TTFT goes ({context})", "", head, "|---|" + "---:|" * len(names)]
    for i, r in enumerate(rows, 1):
        cells = " | ".join(f"{r[f'{n}_mean_ms']} / {r[f'{n}_p50_ms']}" for n in names)
        lines.append(f"| {i} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(".bench/path-split"))
    ap.add_argument("--gpus", type=int, default=4, help="emulated A100-80GB (4, as --quick)")
    ap.add_argument("--rate", type=float, default=32.0, help="conversations/s (32: JSQ's SLO load at 4 GPUs)")
    ap.add_argument(
        "--span", type=float, default=20.0, help="seconds of conversation starts (20, as --quick)"
    )
    ap.add_argument("--dispatch", default="jsq", help="the service's dispatch policy (jsq)")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args(argv)
    setup = Setup(args.dispatch, True)
    rows = []
    for i in range(args.runs):
        rows.append(run(args.out / f"run-{i + 1}", args.gpus, setup, args.rate, args.span))
        print(json.dumps(rows[-1]), flush=True)
    context = f"{args.gpus} emulated A100-80GB, {args.dispatch}, {args.rate:g} conversations/s"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "path_split.json").write_text(json.dumps({"context": context, "runs": rows}, indent=1) + "\n")
    (args.out / "path_split.md").write_text(markdown(rows, context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
