"""The helpers ``make bench-fleet`` judges its goals with: the rate-step trace both sides replay, and
"live GPUs follow the simulator's count within one planning interval"."""

from __future__ import annotations

import pytest

from tools.bench import fleet_common, step_trace


def test_step_trace_is_seeded_and_steps_the_rate(tmp_path) -> None:
    from llmfleet.workload.azure_trace import read_azure_trace

    n = step_trace.write_step_trace(tmp_path / "a.csv", [(2.0, 100.0), (8.0, 100.0)], None, seed=3)
    assert step_trace.write_step_trace(tmp_path / "b.csv", [(2.0, 100.0), (8.0, 100.0)], None, seed=3) == n
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    rows = read_azure_trace(tmp_path / "a.csv")
    first = sum(1 for r in rows if r.offset_s < 100.0 - rows[0].offset_s)
    assert 150 < first < 250 and 600 < n - first < 1000  # Poisson: 200 then 800 expected
    assert all(r.prompt_tokens >= 16 and r.output_tokens >= 4 for r in rows)
    with pytest.raises(ValueError, match="rate >= 0"):
        step_trace.write_step_trace(tmp_path / "c.csv", [(-1.0, 10.0)], None)


def test_follows_allows_one_interval_of_lag_and_names_the_worst_miss() -> None:
    sim = [(0.0, 1), (100.0, 3), (200.0, 1)]
    assert (
        fleet_common.at(sim, 99.9) == 1 and fleet_common.at(sim, 100.0) == 3 and fleet_common.at([], 5.0) == 0
    )
    lagged = [(0.0, 1), (108.0, 3), (209.0, 1)]  # within 10 s of every change
    assert fleet_common.follows(sim, lagged, 10.0, 300.0) == {
        "seconds": 301,
        "within": 301,
        "share": 1.0,
        "worst_gpus_off": 0,
    }
    late = [(0.0, 1), (130.0, 2), (150.0, 3), (200.0, 1)]  # 30 s late, and at 2 on the way
    f = fleet_common.follows(sim, late, 10.0, 300.0)
    assert f["within"] < f["seconds"] and f["worst_gpus_off"] == 2


def test_the_fleet_sets_its_cost_source_once_and_reads_the_engines_pacing() -> None:
    from llmfleet.costmodel import DEFAULT_COST_SOURCE
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    spec = fleet_common.FleetSpec(4, {"policy": "static"})
    assert spec.cost_source == DEFAULT_COST_SOURCE
    assert (
        fleet_common.FleetSpec(4, {}, cost_source="roofline").config()["emulated"]["cost_source"]
        == "roofline"
    )
    assert fleet_common.metrics_ports("127.0.0.1:51061..51063") == [
        "127.0.0.1:51061",
        "127.0.0.1:51062",
        "127.0.0.1:51063",
    ]
    assert fleet_common.metrics_ports("h:9") == ["h:9"]
    registry = CollectorRegistry()
    Counter("llmfleet_emulated_host_steps", "steps", registry=registry).inc(4)
    Counter("llmfleet_emulated_host_seconds", "seconds", registry=registry).inc(0.01)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        got = fleet_common.scrape(f"127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert got["llmfleet_emulated_host_steps_total"] == 4.0
    assert got["llmfleet_emulated_host_seconds_total"] == pytest.approx(0.01)
    assert fleet_common.scrape("127.0.0.1:1") == {}  # nothing there
