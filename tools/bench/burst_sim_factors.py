"""The emulated L4 burst of ``make bench-burst`` in the simulator, one factor at a time
(``.venv/bin/python -m tools.bench.burst_sim_factors``): the rows of the simulator column in
docs/benchmarks/burst.md, "Why the emulated L4 burst stays under 1.8×".

The setup is ``burst_bench.simulate_burst``'s: the shipped ``deploy/local/cluster.yaml`` with the
emulated models (chat on llama2-7b, summarize on opt-6.7b), three L4 GPUs as tp-1 engines, the live
initial plan (one engine per service, the third idle), 1,000 requests at t = 0. Each row changes one
thing: the binding and ``queue_slack``, the engines' ``max_running`` (220: what an L4's KV pool holds
to the end of a 64-token request, so nothing is preempted), or the initial plan (both chat engines up
from the start, the placement loop idle). ``--hetero`` adds bursts of log-normal lengths (prompts
around 100 tokens, outputs around 60; one per seed) for the slack comparison.
"""

from __future__ import annotations

import argparse
import copy
import json
from typing import Any

import numpy as np
import yaml
from llmfleet.policies.placement import InstancePlan

from tools.bench.burst_bench import DEFAULT_CONFIG, EMULATED_MODELS, burst_sim, heterogeneous, identical

L4 = "3xL4"
CHAT, SUMMARIZE = ("llama2-7b",), ("opt-6.7b",)
SCALE_OUT = (CHAT, SUMMARIZE)  # the live plan before the burst: the third GPU idle
BOTH_UP = (CHAT, SUMMARIZE, CHAT)  # no scale-out: both chat engines from t = 0


def run(
    scheduler: dict[str, Any], rows: list[tuple[int, int]], plan: tuple, engine: dict | None = None
) -> dict[str, float]:
    """Makespan, output tokens/s and p50/p99 latency of one simulated burst."""

    doc = {**yaml.safe_load(DEFAULT_CONFIG.read_text()), "models": copy.deepcopy(EMULATED_MODELS)}
    doc["scheduler"] = {**doc.get("scheduler", {}), **scheduler}
    if engine:
        doc["engines"] = {name: dict(engine) for name in doc["engines"]}
    if plan == BOTH_UP:  # the plan stays: the loop never plans again
        doc["placement"] = {**doc["placement"], "interval_s": 1e6}
    instances = [InstancePlan(f"e{i}", models) for i, models in enumerate(plan)]
    records = [r for r in burst_sim(doc, L4, instances, rows).records if r.done]
    end = max(r.arrival_s + r.latency_s for r in records)
    lat = np.array([r.latency_s for r in records])
    return {
        "makespan_s": round(float(end), 2), "tokens_per_s": round(sum(r.output_tokens for r in records) / end),
        "p50_s": round(float(np.percentile(lat, 50)), 2), "p99_s": round(float(np.percentile(lat, 99)), 2),
        "completed": len(records),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hetero", type=int, nargs="*", default=[], help="seeds of heterogeneous bursts")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    args = ap.parse_args(argv)
    same = identical(1000)
    rows = [("early binding, one chat engine", run({"binding": "early"}, same, SCALE_OUT))]
    for slack in (4, 0, 16, 34, 64):
        rows.append((f"late, queue_slack {slack}", run({"queue_slack": slack}, same, SCALE_OUT)))
    for slack in (4, 0):
        no_preempt = run({"queue_slack": slack}, same, SCALE_OUT, {"max_running": 220})
        rows.append((f"late, queue_slack {slack}, engines admit 220 (no preemption)", no_preempt))
    rows.append(("both chat engines up from t = 0, early binding", run({"binding": "early"}, same, BOTH_UP)))
    for slack in (4, 0):
        rows.append(
            (f"both up from t = 0, late, queue_slack {slack}", run({"queue_slack": slack}, same, BOTH_UP))
        )
    for seed in args.hetero:
        work = heterogeneous(seed)
        for slack in (0, 4):
            for name, plan in (("scale-out", SCALE_OUT), ("both up", BOTH_UP)):
                rows.append((f"heterogeneous seed {seed}, {name}, queue_slack {slack}", run({"queue_slack": slack}, work, plan)))  # fmt: skip
    if args.json:
        print(json.dumps(dict(rows), indent=2))
        return 0
    base = rows[0][1]["makespan_s"]
    print(
        "| burst | makespan s | vs early, one engine | tokens/s | p50 s | p99 s |\n|---|---|---|---|---|---|"
    )
    for name, r in rows:
        ratio = f"{base / r['makespan_s']:.2f}×" if not name.startswith("heterogeneous") else "—"
        print(f"| {name} | {r['makespan_s']} | {ratio} | {r['tokens_per_s']} | {r['p50_s']} | {r['p99_s']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
