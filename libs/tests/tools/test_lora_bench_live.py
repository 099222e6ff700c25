"""bench-lora's live arm: its cluster file is a valid emulated fleet of adapter services, and its trace
keeps each request's adapter service through the replay's loader."""

from __future__ import annotations

from pathlib import Path

from llmfleet.config import ClusterConfig
from llmfleet.sim.spec import from_cluster_config
from llmfleet.workload import load_azure_trace

from tools.bench.lora_bench import (
    Setup,
    adapter_name,
    live_markdown,
    make_requests,
    path_parts,
    service_name,
    within_tolerance,
)
from tools.bench.lora_bench_live import cluster_file, write_trace


def test_the_cluster_file_places_the_base_and_serves_every_adapter() -> None:
    services = {service_name(i): adapter_name(i) for i in range(32)}
    doc = cluster_file(services, 4, "A100-80GB", 8, 16, "lora_affinity", {"ttft_s": 2.0, "tpot_s": 0.1})
    config = ClusterConfig.model_validate(doc)
    assert config.catalog_models() == {"llama2-7b": "llama2-7b"}
    assert config.emulated is not None and config.emulated.engine.max_loras == 8
    sims, engine = from_cluster_config(config)
    assert {(s.model, s.lora_rank) for s in sims} == {("llama2-7b", 16)}
    assert sorted(s.adapter for s in sims) == sorted(services.values())
    assert (engine.max_loras, engine.max_lora_rank) == (8, 16)


def test_the_trace_keeps_each_requests_service(tmp_path: Path) -> None:
    reqs = make_requests(Setup(duration_s=5.0), 4.0)
    w = load_azure_trace(write_trace(tmp_path / "t.csv", reqs))
    assert [(r.service, r.prompt_tokens, r.output_tokens) for r in w.requests] == [
        (r.service, r.prompt_tokens, r.output_tokens) for r in reqs
    ]


def test_the_live_table_shows_the_paths_parts_at_p50() -> None:
    """Each arm's row carries the path's three parts (client↔scheduler, the scheduler, scheduler↔engine)
    at p50 in ms, and '-' for an arm that recorded none."""
    arm = {
        "dispatch": "lora_affinity",
        "live": {"completed": 10},
        "sim": {"completed": 10},
        "live_over_sim": {"output_tokens_per_s": 1.0, "ttft_p50_s": 1.2, "engine_ttft_mean_s": 0.9},
        "path_ms": {
            "client_scheduler_p50_ms": 3.1,
            "scheduler_dispatch_p50_ms": 0.2,
            "scheduler_engine_p50_ms": 6.4,
        },
    }
    arms = [arm, {**arm, "dispatch": "jsq", "path_ms": {}}]
    doc = {"rate": 40.0, "duration_s": 60.0, "arms": arms, "within_15pct": within_tolerance(arms)}
    rows = [
        line for line in live_markdown(doc) if line.startswith("| lora_affinity") or line.startswith("| jsq")
    ]
    assert rows[0].endswith("| 3.1 / 0.2 / 6.4 |")
    assert rows[1].endswith("| - |")
    assert path_parts(arm) == "3.1 / 0.2 / 6.4"
