"""The ``groups`` section of ``make bench-prefix``: llm-d's prefix-cache benchmark workload in the
simulator, the same rate rule as the multi-turn sweep.

**Workload** (``llmfleet.workload.shared_prefix``, ``--shared-prefix`` of ``llmfleet sim``/``load``):
inference-perf's ``shared_prefix`` generator as llm-d's published prefix-cache-aware routing runs set
it (150 groups, 5 prompts per group, a 6,000-token system prompt, a 1,200-token question, 1,000
output tokens), Poisson arrivals. A run sends ``requests`` requests (default 3,000: four passes over
the 750 distinct prompts, so a group's prefix is reused many times in every run), so the span is
``requests / rate``; throughput is measured in the window from a quarter of the span to its end.

**Live** (``--groups-live-requests N``): JSQ and ``prefix_affinity`` at JSQ's SLO load on 16 emulated
H200 (``llmfleet up --emulate``, ``llmfleet load --shared-prefix``), each beside ``llmfleet sim`` of the
same cluster file and workload, N requests a run. Saturation is not run live: affinity saturates
past 20,000 output tokens/s, more than this machine's two cores can stream through a scheduler and a
load generator.

**Deployment.** llm-d ran Qwen3-32B on 16 H100 as 8 TP-2 replicas. Here: Qwen3-32B (its shape in
the cost-model catalog) on 16 H200, one GPU per engine. The simulator's placement makes the smallest
instance that fits (``dedicated_even``), and Qwen3-32B fits one H100 with only 11 GB of KV (about
40,000 tokens: five of these requests); on an H200 one GPU holds 64 GB of KV, about what a TP-2 H100
replica holds per GPU. So the per-GPU KV room, which decides how many group prefixes an engine
caches, is close to llm-d's, while the engines are 16 of one GPU instead of 8 of two (a deviation,
stated in the report).

**Setups**: ``round_robin`` (llm-d's baseline), ``jsq`` and ``prefix_affinity``, caching on, FCFS
engines. Loads: the doubling sweep and saturation rule of the multi-turn sweep
(:func:`~tools.bench.prefix_bench_common.pick_loads`), JSQ as the reference.

The published figures (quoted in the issue): against round robin, output tokens/s 5,722 → 12,598 at
saturation, and at an unsaturated 10 req/s TTFT 0.630 → 0.150 s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tools.bench.fleet_common import FleetSpec
from tools.bench.prefix_bench_common import (
    PLACEMENT,
    Setup,
    pick_loads,
    ratio,
    simulate,
    still_needed,
    summary,
)
from tools.bench.prefix_bench_live import emulated_run
from tools.bench.prefix_bench_sim import at_saturation

GPUS, HARDWARE, MODEL = 16, "H200", "qwen3-32b"
SERVICES = {"chat": {"model": MODEL, "slo": {"ttft_s": 2.0, "tpot_s": 0.1}}}
REQUESTS = 3000
COMPARED = [Setup("round_robin", True), Setup("jsq", True), Setup("prefix_affinity", True)]
REFERENCE, BASELINE, CANDIDATE = COMPARED[1], COMPARED[0], COMPARED[2]


def fleet_spec(setup: Setup) -> FleetSpec:
    engine = {"policy": setup.engine, "prefix_caching": setup.caching}
    return FleetSpec(
        GPUS,
        dict(PLACEMENT),
        hardware=HARDWARE,
        services=dict(SERVICES),
        engine=engine,
        dispatch=setup.dispatch,
    )


def cluster_file(path: Path, setup: Setup) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(fleet_spec(setup).config(), sort_keys=False))
    return path


def workload_flags(rate: float, requests: int) -> list[str]:
    return ["--shared-prefix", str(requests), "--rate", f"{rate:g}", "--seed", "0"]


def sim_argv(config: Path, setup: Setup, rate: float, requests: int) -> list[str]:
    return [
        *workload_flags(rate, requests), "--cluster", f"{GPUS}x{HARDWARE}", "--cluster-config", str(config), "--policy", "fcfs-jsq",
        "--engine-policy", setup.engine, "--dispatch", setup.dispatch, "--engine-gpus", "1", "--no-plots",
    ]  # fmt: skip


def run_one(out: Path, setup: Setup, rate: float, requests: int) -> dict[str, Any]:
    config = cluster_file(out / f"{setup.slug}.yaml", setup)
    span = requests / rate
    row = summary(simulate(sim_argv(config, setup, rate, requests)), (0.25 * span, span))
    print(json.dumps({"section": "groups", "rate": rate, "setup": setup.name, **row}), flush=True)
    return row


def bench_groups_live(out: Path, rate: float, requests: int) -> dict[str, Any]:
    """JSQ and ``prefix_affinity`` live on the 16 emulated GPUs at ``rate`` (JSQ's SLO load), each beside
    ``llmfleet sim`` of the same cluster file and workload."""
    span = requests / rate
    runs = {
        s.name: emulated_run(
            out / "groups" / f"live-{rate:g}", fleet_spec(s), s, workload_flags(rate, requests),
            (0.25 * span, span), span * 4 + 900,
        )
        for s in (REFERENCE, CANDIDATE)
    }  # fmt: skip

    def live(name: str) -> float | None:
        return runs[name]["live"].get("ttft_mean_s")

    return {
        "rate": rate,
        "requests": requests,
        "runs": runs,
        "ttft_mean_ratio": ratio(live(CANDIDATE.name), live(REFERENCE.name)),
    }


def bench_groups(
    out: Path, rates: list[float], requests: int = REQUESTS, live_requests: int | None = None
) -> dict[str, Any]:
    rows: dict[float, dict[str, dict]] = {}
    for rate in rates:
        todo = [s for s in COMPARED if still_needed(rows, REFERENCE.name, s.name)]
        if not todo:
            break
        rows[rate] = {s.name: run_one(out / "groups" / f"rate-{rate:g}", s, rate, requests) for s in todo}
    loads = pick_loads(rows, REFERENCE.name)
    slo = rows[loads["slo"]] if loads["slo"] is not None else {}
    sat = at_saturation(rows)

    def fig(where: dict, name: str, key: str) -> float | None:
        return (where.get(name) or {}).get(key)

    ratios = {
        f"{CANDIDATE.name} / {ref.name} {what}": ratio(
            fig(where, CANDIDATE.name, key), fig(where, ref.name, key)
        )
        for ref in (REFERENCE, BASELINE)
        for what, where, key in (
            ("TTFT mean at JSQ's SLO load", slo, "ttft_mean_s"),
            ("window tokens/s at saturation", sat, "window_tokens_per_s"),
        )
    }
    live = (
        bench_groups_live(out, loads["slo"], live_requests)
        if live_requests is not None and loads["slo"] is not None
        else None
    )
    return {
        "live": live,
        "deployment": f"{MODEL} on {GPUS} {HARDWARE}, one GPU per engine (llm-d: 8 TP-2 replicas on 16 H100)",
        "workload": {
            "requests": requests,
            "flags": "--shared-prefix (150 groups × 5 prompts, 6000 + 1200 → 1000)",
        },
        "rates": rates,
        "sweep": {f"{r:g}": v for r, v in rows.items()},
        "loads": loads,
        "at": {"slo": slo, "saturation": sat},
        "ratios": ratios,
    }
