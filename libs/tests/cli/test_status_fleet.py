"""``llmfleet status``, fleet part: the engine pool with GPUs in use (from etcd), and the placement
leader's decisions and service monitor (from GetPlan; a leader that cannot be asked is noted)."""

from __future__ import annotations

import json

import grpc
from llmfleet.api.v1 import placement_pb2
from llmfleet.cli.status import KV, ClusterStatus, collect_status, render_status
from llmfleet.coord.keys import Keys
from llmfleet.monitor import Completion, Decision, ServiceMonitor
from llmfleet.monitor.wire import decision_to_proto, stats_to_proto
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, ModelSpec, NodeRecord, Slo
from rich.console import Console

KEYS = Keys("/llmfleet")
LLAMA = ModelSpec("tiny-llama", "tiny://llama")


class DictSource:
    def __init__(self, data: dict[str, bytes]) -> None:
        self.data = data

    async def range(self, prefix: str, leases: bool = False) -> list[KV]:
        return [KV(k, v) for k, v in sorted(self.data.items()) if k.startswith(prefix)]

    async def lease_ttl(self, lease_id: int) -> int:
        return -1


def cluster() -> dict[str, bytes]:
    nodes = [
        NodeRecord("engine-0", ENGINE_ROLE, "h:1", "cpu", 8 << 30, models=("tiny-llama",), hardware="cpu"),
        NodeRecord("engine-1", ENGINE_ROLE, "h:2", "cuda:0", 80 << 30, hardware="a100-80gb", tp=2),
        NodeRecord("engine-2", ENGINE_ROLE, "h:3", "cuda:0", 80 << 30, hardware="a100-80gb", tp=2),
        NodeRecord("placement-0", "placement", "h:9"),
    ]
    data = {KEYS.node(n.node_id): n.to_json() for n in nodes}
    data[KEYS.placement("engine-0")] = DesiredPlacement("engine-0", (LLAMA,)).to_json()
    data[KEYS.placement("engine-1")] = DesiredPlacement("engine-1", (LLAMA,)).to_json()  # loading
    data[KEYS.leader("placement")] = b"placement-0"
    return data


def plan_reply() -> placement_pb2.PlacementPlan:
    m = ServiceMonitor(start_s=0.0)
    for i in range(20):
        m.arrive("chat", "tiny-llama", i)
        m.complete(Completion("chat", "tiny-llama", i, 30, 10, 0.1, 0.02, 0.28, ok=i != 3))
    plan = placement_pb2.PlacementPlan(leader_id="placement-0", is_leader=True)
    plan.services.extend(
        stats_to_proto(s, 30.0, samples=False) for s in m.stats(30.0, {"chat": Slo(1.0, 0.1)})
    )
    plan.decisions.extend(
        [
            decision_to_proto(
                Decision(1.7e9, "seallm", "engine-1: + tiny-llama", "chat attainment 0.6 < 0.9")
            ),
            decision_to_proto(Decision.failed(1.7e9 + 60, "seallm", "llama-70b fits no engine group")),
        ]
    )
    return plan


async def test_pool_decisions_and_monitor():
    asked = []

    async def plan(address: str) -> placement_pb2.PlacementPlan:
        asked.append(address)
        return plan_reply()

    status = await collect_status(DictSource(cluster()), KEYS, plan=plan)
    assert asked == ["h:9"]
    f = status.to_dict()["fleet"]
    assert [(e["engine_id"], e["tp"], e["idle"]) for e in f["pool"]] == [
        ("engine-0", 1, False),
        ("engine-1", 2, False),
        ("engine-2", 2, True),
    ]
    assert (f["gpus_in_use"], f["gpus_total"]) == (3, 5) and f["plan_error"] is None
    assert [d["summary"] for d in f["decisions"]] == ["engine-1: + tiny-llama", "kept the last good plan"]
    (chat,) = f["monitor"]
    assert (
        chat["service"] == "chat"
        and chat["window_s"] == 60
        and (chat["completed"], chat["failed"]) == (19, 1)
    )
    assert chat["attainment"] == 19 / 20 and chat["mean_prompt_tokens"] == 30
    json.dumps(status.to_dict())

    console = Console(record=True, width=220)
    render_status(status, console)
    text = console.export_text()
    for needle in ("GPUs in use: 3 of 5", "a100-80gb", "idle", "+tiny-llama", "service monitor", "95%",
                   "engine-1: + tiny-llama", "fits no engine group", "chat attainment 0.6"):  # fmt: skip
        assert needle in text, needle
    render_status(ClusterStatus(prefix="/x"), Console(record=True))  # empty cluster renders too


async def test_placement_leader_that_cannot_be_asked_is_noted():
    async def down(address: str) -> placement_pb2.PlacementPlan:
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "connection refused")

    status = await collect_status(DictSource(cluster()), KEYS, plan=down)
    assert status.fleet.plan_error == "placement leader placement-0 at h:9: connection refused"
    assert status.fleet.gpus_in_use == 3  # the etcd part stands
    console = Console(record=True, width=200)
    render_status(status, console)
    assert "placement leader not asked" in console.export_text()

    data = cluster()
    del data[KEYS.leader("placement")]
    status = await collect_status(DictSource(data), KEYS, plan=down)
    assert status.fleet.plan_error == "no placement leader"
    status = await collect_status(DictSource(cluster()), KEYS)  # not asked at all
    assert status.fleet.plan_error is None and not status.fleet.decisions
