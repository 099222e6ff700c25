"""The service monitor and the engine pool on a real cluster: the scheduler streams per-service
statistics to the placement leader once requests complete (GetPlan and ``llmfleet status`` show
them), engines register hardware and tp, and the reports follow the leader when it dies."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from harness import TTL_S, Cluster, launch
from llmfleet.api.v1 import placement_pb2, placement_pb2_grpc
from llmfleet.client import AsyncClient

PROMPT = "Once upon a time there was a fleet of models"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    c = launch(tmp_path_factory.mktemp("monitor"), scheduler_args=("--stats-interval-s", "0.5"))
    try:
        yield c
    finally:
        c.stop()


async def get_plan(address: str) -> placement_pb2.PlacementPlan:
    async with grpc.aio.insecure_channel(address) as ch:
        return await placement_pb2_grpc.PlacementStub(ch).GetPlan(placement_pb2.GetPlanRequest(), timeout=5)


async def wait_plan(address: str, predicate, timeout: float, what: str) -> placement_pb2.PlacementPlan:
    deadline = time.monotonic() + timeout
    plan = None
    while time.monotonic() < deadline:
        try:
            plan = await get_plan(address)
            if predicate(plan):
                return plan
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last plan: {plan}")


def window(plan: placement_pb2.PlacementPlan, service: str, window_s: float = 60.0):
    for s in plan.services:
        if s.service == service:
            return next((w for w in s.windows if w.window_s == window_s), None)
    return None


def completed(service: str, n: int):
    return lambda plan: (w := window(plan, service)) is not None and w.completed >= n


async def test_scheduler_streams_stats_to_the_placement_leader(cluster: Cluster):
    async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
        outs = await asyncio.gather(
            *(client.complete(PROMPT, service="chat", max_tokens=8) for _ in range(6))
        )
        await client.complete("Hello", service="summarize", max_tokens=4)
    assert all(o.usage.completion_tokens == 8 for o in outs)
    leader = {x["role"]: x["leader"] for x in cluster.status()["leaders"]}["placement"]
    plan = await wait_plan(cluster.addresses[leader], completed("chat", 6), 20, "chat's stats at the leader")
    assert plan.is_leader
    chat = window(plan, "chat")
    assert chat.arrivals >= 6 and chat.rate_rps > 0 and chat.failed == 0
    assert chat.output_tokens.mean == 8 and chat.prompt_tokens.mean > 0
    assert chat.ttft_s.count == chat.completed and 0 < chat.ttft_s.p50 <= chat.latency_s.p99
    assert chat.slo_met <= chat.completed and chat.normalized_count == chat.completed
    assert window(plan, "unplaced") is not None  # a known service without traffic is reported too
    await wait_plan(cluster.addresses[leader], completed("summarize", 1), 10, "summarize's stats")

    # the engine pool: both engines host models, registered as cpu with tp 1
    assert [(e.engine_id, e.hardware, e.tp, e.idle) for e in plan.pool] == [
        ("engine-0", "cpu", 1, False),
        ("engine-1", "cpu", 1, False),
    ]
    assert (plan.gpus_in_use, plan.gpus_total) == (2, 2)

    status = await asyncio.to_thread(cluster.status)
    fleet = status["fleet"]
    assert (fleet["gpus_in_use"], fleet["gpus_total"]) == (2, 2) and fleet["plan_error"] is None
    assert {e["engine_id"]: e["hardware"] for e in fleet["pool"]} == {"engine-0": "cpu", "engine-1": "cpu"}
    rows = {m["service"]: m for m in fleet["monitor"]}
    assert rows["chat"]["completed"] >= 6 and rows["chat"]["attainment"] is not None
    assert rows["unplaced"]["rate_rps"] == 0 and rows["unplaced"]["attainment"] is None


async def test_reports_follow_the_leader_when_it_dies(cluster: Cluster):
    leaders = {x["role"]: x["leader"] for x in cluster.status()["leaders"]}
    old = leaders["placement"]
    standby = ({"placement-0", "placement-1"} - {old}).pop()
    cluster.procs.kill(old)
    await asyncio.to_thread(
        cluster.wait_status,
        lambda s: {x["role"]: x["leader"] for x in s["leaders"]}.get("placement") == standby,
        3 * TTL_S + 5,
        "the standby to take placement leadership",
    )
    async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
        await asyncio.gather(*(client.complete(PROMPT, service="chat", max_tokens=4) for _ in range(3)))
    # a report is the scheduler's whole window: the new leader sees the 6 completions of the first
    # test (made while the old one led) as well as the 3 new ones
    plan = await wait_plan(
        cluster.addresses[standby], completed("chat", 9), 20, "chat's stats at the new leader"
    )
    assert plan.is_leader and plan.leader_id == standby
