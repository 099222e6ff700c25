"""The live arm of ``make bench-lora``: the Zipf adapter workload replayed with ``llmfleet load`` on
``llmfleet up --emulate 4xA100-80GB`` (emulated engines with ``max_loras`` adapter slots each, the
simulator's pool rule and LoRA costs), beside ``llmfleet sim`` on the same cluster file and trace,
compared by ``llmfleet compare``.

The cluster file: the base ``llama2-7b`` (``emulated://llama2-7b``), one adapter entry per service
(``emulated://r16``: rank 16, no files), ``colocate_all`` placement (the base on every engine; the
adapters follow their traffic), the arm's dispatch on the schedulers, and prefix caching on (the
default): a length-only trace's requests have no content, and ``llmfleet load`` fills their prompts
with seeded words that share no cached block, so neither side finds a cached prefix (the engine
counters in the report show it). The trace is the simulated arms' request list (same seed, Zipf over
the adapters, log-normal lengths) at a rate and duration small enough for the host (a CSV with a
``Service`` column, which ``llmfleet load`` and ``llmfleet sim`` keep as each request's service).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from tools.bench.fleet_common import Fleet, FleetSpec, compare, run_load, run_sim
from tools.bench.path_split import figures as path_figures
from tools.bench.prefix_bench_common import ratio
from tools.bench.prefix_bench_live import live_figures
from tools.bench.prefix_bench_metrics import COUNTER, COUNTER_NAMES, metrics_addresses, scrape_sums

ADAPTER_LOADS = re.compile(r"^llmfleet_lora_(adapter_loads)_total(?:\{[^}]*\})? (\S+)$")

BASE_SOURCE = {"source": "emulated://llama2-7b", "dtype": "float16"}
LIVE_VS_SIM = (
    "output_tokens_per_s", "completed_rps", "ttft_p50_s", "ttft_mean_s", "ttft_p99_s", "engine_ttft_mean_s"
)  # fmt: skip


def write_trace(path: Path, requests: list[Any]) -> Path:
    """The requests as a trace CSV (numeric seconds, lengths, service)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens", "Service"])
        for r in requests:
            w.writerow([f"{r.arrival_s:.6f}", r.prompt_tokens, r.output_tokens, r.service])
    return path


class LoraFleetSpec(FleetSpec):
    """An emulated fleet whose cluster file is given whole (adapter entries, engine LoRA slots)."""

    def __init__(self, cluster: dict[str, Any], gpus: int, hardware: str, processes: int = 0) -> None:
        super().__init__(
            gpus=gpus, placement=cluster["placement"], hardware=hardware, processes=processes, services={}
        )
        self.cluster = cluster

    def config(self) -> dict[str, Any]:
        return self.cluster


def cluster_file(
    services: dict[str, str], gpus: int, hardware: str, max_loras: int, rank: int, dispatch: str, slo: dict
) -> dict[str, Any]:
    """The cluster file of the live arm: ``services`` (service -> adapter) on the base, ``gpus`` emulated
    engines of ``max_loras`` slots, ``dispatch`` on the schedulers."""
    return {
        "services": {s: {"model": a, "slo": slo} for s, a in services.items()},
        "models": {
            "llama2-7b": BASE_SOURCE,
            **{a: {"base": "llama2-7b", "adapter": f"emulated://r{rank}"} for a in services.values()},
        },
        "placement": {"policy": "colocate_all", "interval_s": 5},
        "scheduler": {"dispatch": {"policy": dispatch}},
        "emulated": {
            "hardware": hardware,
            "count": gpus,
            "engine": {"max_loras": max_loras, "max_lora_rank": rank},
        },
    }


def live_arm(
    out: Path, cluster: dict[str, Any], trace: Path, dispatch: str, timeout_s: float, host_processes: int = 0
) -> dict[str, Any]:
    """The trace live on the emulated fleet (its GPUs on ``host_processes`` engine hosts; 0: one per 16)
    and in ``llmfleet sim`` (same cluster file), compared."""
    pool = cluster["emulated"]
    spec = LoraFleetSpec(cluster, pool["count"], pool["hardware"], host_processes)
    fleet = Fleet(out / dispatch, spec)
    workload = ["--trace", str(trace)]
    fleet.start()
    try:
        addresses = metrics_addresses(fleet.endpoints)
        cpu0 = fleet.cpu_seconds()
        # the counters are read once, after the load: a /metrics page is built under the engine host's
        # GIL, and scraping it through the run would delay the emulated steps it measures
        load = run_load(fleet, workload, fleet.dir / "live", timeout_s)
        totals = dict.fromkeys((*COUNTER_NAMES, "adapter_loads"), 0.0)
        engine_counters = scrape_sums(addresses, totals, COUNTER, ADAPTER_LOADS)
        cpu = {k: round(v - cpu0.get(k, 0.0), 2) for k, v in fleet.cpu_seconds().items()}
        pacing = fleet.emulated_pacing()
    finally:
        fleet.stop()
    sim_dir = fleet.dir / "sim"
    sim_rc = run_sim(spec, fleet.config, workload, "fcfs-jsq", sim_dir, ["--dispatch", dispatch])
    cmp = compare(sim_dir, fleet.dir / "live", fleet.dir / "compare")
    live_report = fleet.dir / "live" / "report.json"
    live = live_figures(live_report)
    sim = live_figures(sim_dir / "report.json")
    row = {
        "dispatch": dispatch,
        "load_rc": load.returncode,
        "sim_rc": sim_rc,
        "live": live,
        "sim": sim,
        "live_over_sim": {k: ratio(live.get(k), sim.get(k)) for k in LIVE_VS_SIM},
        "engine_counters": {k: engine_counters[k] for k in COUNTER_NAMES},
        "pacing": pacing,
        "cpu_s": cpu,  # per process of the fleet, while the load ran
        # the client's TTFT, the engines' own and the path between them in its three parts (ms)
        "path_ms": path_figures(json.loads(live_report.read_text())["runs"][0])
        if live_report.exists()
        else {},
        # adapters put in a slot (misses), the engines' count against the simulator's
        "adapter_loads": {
            "live": int(engine_counters["adapter_loads"]),
            "sim": _sim_adapter_loads(sim_dir / "report.json"),
        },
        "compare": cmp.get("text", ""),
    }
    print(json.dumps({k: v for k, v in row.items() if k != "compare"}), flush=True)
    return row


def _sim_adapter_loads(report: Path) -> int | None:
    if not report.exists():
        return None
    return json.loads(report.read_text())["runs"][0]["cluster"].get("adapter_loads")
