"""The monitor's wire form (ages on the wire, bad numbers refused), the engine pool, hardware names,
and the package's purity (only ``wire`` knows protobuf; nothing reads the clock)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from llmfleet.api.v1 import placement_pb2
from llmfleet.monitor import Completion, Decision, ServiceMonitor, decision_log, engine_pool, guess_hardware
from llmfleet.monitor.wire import (
    BadReport,
    decision_from_proto,
    decision_to_proto,
    pool_to_proto,
    stats_from_proto,
    stats_to_proto,
)
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, ModelSpec, NodeRecord

MONITOR = Path(__file__).resolve().parents[2] / "llmfleet" / "monitor"


def sample_stats(now: float = 50.0):
    m = ServiceMonitor(start_s=0.0)
    for i in range(30):
        m.arrive("chat", "llama", i)
        m.complete(Completion("chat", "llama", i, 10 + i, 5, 0.1, 0.02, 0.18, ok=i % 10 != 0))
    return m.stats(now)[0]


def test_stats_round_trip_with_ages():
    s = sample_stats()
    msg = placement_pb2.ServiceStats.FromString(stats_to_proto(s, now=50.0).SerializeToString())
    assert msg.samples[-1].age_s == pytest.approx(50.0 - 29)
    back = stats_from_proto(msg, now=1050.0)  # the receiver's clock is 1000 s ahead
    assert back.windows == s.windows and back.model == "llama"
    assert [x.arrival_s - 1000.0 for x in back.samples] == pytest.approx([x.arrival_s for x in s.samples])
    assert back.samples_complete
    assert not stats_to_proto(s, 50.0, samples=False).samples


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda m: setattr(m, "service", ""), "name"),
        (lambda m: setattr(m.windows[0], "rate_rps", float("nan")), "finite"),
        (lambda m: setattr(m.windows[0].ttft_s, "p99", -1.0), ">= 0"),
        (lambda m: setattr(m.windows[0], "slo_met", 10**6), "more requests met"),
        (lambda m: setattr(m.windows[1], "window_s", m.windows[0].window_s), "same length"),
        (lambda m: setattr(m.windows[0], "window_s", 0.0), "positive"),
    ],
)
def test_bad_reports_are_refused(mutate, needle):
    msg = stats_to_proto(sample_stats(), 50.0)
    mutate(msg)
    with pytest.raises(BadReport, match=needle):
        stats_from_proto(msg, 0.0)


def test_engine_pool_counts_gpus_in_use():
    llama = ModelSpec("llama", "tiny://llama")
    nodes = [
        NodeRecord(
            "e0", ENGINE_ROLE, "a:1", "cuda:0", 80 << 30, models=("llama",), hardware="a100-80gb", tp=2
        ),
        NodeRecord(
            "e1", ENGINE_ROLE, "a:2", "cuda:0", 80 << 30, hardware="a100-80gb", tp=4
        ),  # being given one
        NodeRecord("e2", ENGINE_ROLE, "a:3", "cpu", hardware="cpu"),  # idle
        NodeRecord("s", "scheduler", "a:4"),
    ]
    desired = {"e0": DesiredPlacement("e0", (llama,)), "e1": DesiredPlacement("e1", (llama,))}
    pool = engine_pool(nodes, desired)
    assert [e.engine_id for e in pool.engines] == ["e0", "e1", "e2"]
    assert (pool.gpus_in_use, pool.gpus_total) == (6, 7)
    assert [e.engine_id for e in pool.idle] == ["e2"] and pool.engines[1].desired == ("llama",)
    plan = placement_pb2.PlacementPlan()
    pool_to_proto(pool, plan)
    assert (plan.gpus_in_use, plan.gpus_total) == (6, 7)
    assert [(p.engine_id, p.idle, p.tp, p.hardware) for p in plan.pool] == [
        ("e0", False, 2, "a100-80gb"),
        ("e1", False, 4, "a100-80gb"),
        ("e2", True, 1, "cpu"),
    ]
    assert engine_pool([]).gpus_total == 0


def test_node_record_reads_records_without_hardware():
    old = b'{"node_id": "e", "role": "engine", "address": "x", "models": ["m"]}'
    rec = NodeRecord.from_json(old)
    assert (rec.hardware, rec.tp) == ("", 1)
    rec = NodeRecord("e", ENGINE_ROLE, "x", hardware="h100", tp=8)
    assert NodeRecord.from_json(rec.to_json()) == rec


@pytest.mark.parametrize(
    "name, memory, want",
    [
        ("NVIDIA H100 80GB HBM3", 80 << 30, "h100"),
        ("NVIDIA A100-SXM4-40GB", 40 << 30, "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", 80 << 30, "a100-80gb"),
        ("NVIDIA A100", 80 << 30, "a100-80gb"),  # no size in the name: the closest memory
        ("NVIDIA H200", 141 * 10**9, "h200"),
        ("NVIDIA GeForce RTX 4090", 24 << 30, "rtx-4090"),
        ("NVIDIA L4", 24 << 30, "l4"),
        ("NVIDIA L40S", 48 << 30, None),  # not an L4
        ("Tesla V100-SXM2-32GB", 32 << 30, "v100"),
    ],
)
def test_guess_hardware(name, memory, want):
    assert guess_hardware(name, memory) == want


def test_decisions_round_trip_and_are_bounded():
    log = decision_log(3)
    for i in range(5):
        log.append(Decision(float(i), "seallm", f"step {i}", "rate up"))
    log.append(Decision.failed(9.0, "seallm", "model too large for any engine group"))
    assert [d.summary for d in log][:2] == ["step 3", "step 4"] and len(log) == 3
    assert decision_from_proto(decision_to_proto(log[-1])) == log[-1] and not log[-1].ok


def test_monitor_is_pure():
    forbidden = {"grpc", "asyncio", "aetcd", "llmfleet.coord", "llmfleet.rpc", "llmfleet.api", "time"}
    offenders = []
    for path in MONITOR.glob("*.py"):
        if path.stem == "wire":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.name}: {n}" for n in names if any(n == f or n.startswith(f + ".") for f in forbidden)
            ]
    assert not offenders


def test_infeasible_counts_travel_and_merge():
    from llmfleet.monitor import FleetMonitor, ServiceMonitor

    a, b = ServiceMonitor(), ServiceMonitor()
    for m, n in ((a, 3), (b, 2)):
        m.arrive("chat", "tiny-llama", 1.0)
        for _ in range(n):
            m.count_infeasible("chat")
    fleet = FleetMonitor()
    for src, m in (("s1", a), ("s2", b)):
        wire = [stats_from_proto(stats_to_proto(s, 2.0), 2.0) for s in m.stats(2.0)]
        assert wire[0].infeasible == m.stats(2.0)[0].infeasible
        fleet.update(src, wire, 2.0)
    assert {s.service: s.infeasible for s in fleet.stats(2.0)} == {"chat": 5}
