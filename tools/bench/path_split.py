"""Where the client's TTFT goes on the emulated fleet: the mean TTFT measured at the client (``llmfleet
load``), at the schedulers (``llmfleet_scheduler_ttft_seconds``, from a scheduler's receipt of the
request) and at the engines (the report's ``live.engine_ttft_s``, from an engine's stamp of its
arrival), on bench-prefix's multi-turn workload and fleet (``--quick``'s emulated section: 4 emulated
A100-80GB, one setup at one load). Means add up where percentiles do not, so the differences split
the path outside the engines into client-to-scheduler and scheduler-to-engine, both ways.

    .venv/bin/python -m tools.bench.path_split --rate 32 --runs 2 --out .bench/path-split
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tools.bench.fleet_common import Fleet, metrics_ports, run_load
from tools.bench.prefix_bench import MAX_CONTEXT, MEAN_TURNS, SYSTEM_TOKENS, THINK_S
from tools.bench.prefix_bench_common import Conversations, Setup
from tools.bench.prefix_bench_sim import fleet_spec

SCHEDULER_TTFT = "llmfleet_scheduler_ttft_seconds"


def histogram_totals(text: str, name: str) -> tuple[float, float]:
    """(sum, count) of histogram ``name`` over every label set of one /metrics page."""
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    return total, count


def _scrape(fleet: Fleet, name: str) -> tuple[float, float]:
    total = count = 0.0
    for row in fleet.endpoints.values():
        for address in metrics_ports(row["metrics"]) if row.get("metrics") else []:
            try:
                with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
                    s, c = histogram_totals(resp.read().decode(), name)
            except OSError:
                continue
            total, count = total + s, count + c
    return total, count


def split(client_ms: float, scheduler_ms: float, engine_ms: float) -> dict[str, float]:
    """The path's parts (ms): client↔scheduler and scheduler↔engine, each both ways."""
    return {
        "client_scheduler_ms": round(client_ms - scheduler_ms, 2),
        "scheduler_engine_ms": round(scheduler_ms - engine_ms, 2),
    }


def run(out: Path, gpus: int, setup: Setup, rate: float, span_s: float) -> dict[str, Any]:
    conv = Conversations(SYSTEM_TOKENS, MEAN_TURNS, THINK_S, MAX_CONTEXT, span_s)
    fleet = Fleet(out, fleet_spec(gpus, setup))
    fleet.start()
    try:
        load = run_load(fleet, conv.flags(rate), out / "live", conv.span_s * 8 + 900)
        scheduler = _scrape(fleet, SCHEDULER_TTFT)
    finally:
        fleet.stop()
    if load.returncode != 0:
        raise RuntimeError(f"llmfleet load exited {load.returncode}: see {out / 'live.out'}")
    report = json.loads((out / "live" / "report.json").read_text())["runs"][0]
    client, engines = report["overall"]["ttft_s"], report["live"]["engine_ttft_s"]
    means = {
        "client_ms": round(1e3 * client["mean"], 2),
        "scheduler_ms": round(1e3 * scheduler[0] / scheduler[1], 2) if scheduler[1] else None,
        "engine_ms": round(1e3 * engines["mean"], 2),
    }
    row = {"requests": client["n"], "scheduler_requests": int(scheduler[1]), **means}
    if means["scheduler_ms"] is not None:
        row |= split(means["client_ms"], means["scheduler_ms"], means["engine_ms"])
    return row


def markdown(rows: list[dict[str, Any]], context: str) -> str:
    head = (
        "| run | client TTFT mean ms | schedulers' | engines' | client↔scheduler ms | scheduler↔engine ms |"
    )
    lines = [f"# Where the client's TTFT goes ({context})", "", head, "|---|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(rows, 1):
        lines.append(
            f"| {i} | {r['client_ms']} | {r['scheduler_ms']} | {r['engine_ms']} | "
            f"{r.get('client_scheduler_ms')} | {r.get('scheduler_engine_ms')} |"
        )
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
