"""Priorities in the capacity gate and admission: a sheddable held request is dropped before it waits
past its TTFT SLO; a higher priority leaves the queue first and, under overload, displaces a held lower
one instead of being refused; the key that was served fewer tokens goes first within a priority."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import grpc
import pytest
from llmfleet.api.v1 import common_pb2, scheduler_pb2
from llmfleet.load import LoadReport
from llmfleet.metrics.control import SchedulerMetrics
from llmfleet.policies.capacity import Saturation
from llmfleet.policies.dispatch import DispatchRequest, make_dispatch_policy
from llmfleet.spec.services import ServiceSpec
from llmfleet.testing import StaticView
from llmfleet.types import ENGINE_ROLE, NodeRecord, Slo
from llmfleet_scheduler.admission import Admission, Overloaded
from llmfleet_scheduler.capacity import CapacityGate, ColdStartTimeout, Shed
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.journal import RequestFailed, RequestRecord
from llmfleet_scheduler.priorities import RequestClass, RequestClasses
from llmfleet_scheduler.servicer import SchedulerServicer
from prometheus_client import CollectorRegistry

SPEC = ServiceSpec("s", "m", Slo(ttft_s=0.3, tpot_s=0.1))
POLICY = make_dispatch_policy("round_robin")


def node(eid: str) -> NodeRecord:
    return NodeRecord(eid, ENGINE_ROLE, f"127.0.0.1:{hash(eid) % 1000 + 20000}", models=("m",))


def saturated(classes: RequestClasses, refused: list[tuple[str, str, int]]) -> CapacityGate:
    """A late-binding gate over one engine with no room."""
    d = ClusterDirectory(
        services_view=StaticView({"s": SPEC}),
        nodes_view=StaticView({"e0": node("e0")}),
        models_view=StaticView({}),
    )
    d.load.report("e0", LoadReport(running=2, waiting=1, max_running=2))
    return CapacityGate(
        d, binding="late", saturation=Saturation(queue_slack=1), poll_s=0.05, classes=classes,
        refuse=lambda rid, msg, retry: refused.append((rid, msg, retry)), metrics=classes.metrics,
    )  # fmt: skip


def req(rid: str, t: float, prompt_tokens: int = 10) -> DispatchRequest:
    return DispatchRequest(rid, "m", "s", prompt_tokens=prompt_tokens, kv_bytes_per_token=1, arrival_s=t)


@contextlib.asynccontextmanager
async def running(gate: CapacityGate):
    task = asyncio.create_task(gate.run())
    try:
        yield gate
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


REGISTRY = CollectorRegistry()  # each test's keys are its own


def count(key: str, priority: int, outcome: str) -> float | None:
    labels = {"key": key, "priority": str(priority), "outcome": outcome}
    return REGISTRY.get_sample_value("llmfleet_scheduler_key_requests_total", labels)


@pytest.fixture(scope="module")
def metrics() -> SchedulerMetrics:
    return SchedulerMetrics(REGISTRY)


@pytest.fixture
def classes(metrics: SchedulerMetrics) -> RequestClasses:
    return RequestClasses(metrics)


async def test_a_sheddable_request_is_dropped_before_its_ttft_slo(classes: RequestClasses) -> None:
    refused: list[tuple[str, str, int]] = []
    gate = saturated(classes, refused)
    classes.add("low", RequestClass(-1, "team-a", 16))
    classes.add("zero", RequestClass(0, "team-a", 16))
    async with running(gate):
        t0 = asyncio.get_running_loop().time()
        low = asyncio.create_task(gate.place(SPEC, POLICY, req("low", 0), frozenset()))
        zero = asyncio.create_task(gate.place(SPEC, POLICY, req("zero", 0), frozenset()))
        with pytest.raises(Shed, match="priority -1 is sheddable"):
            await asyncio.wait_for(low, 2)
        waited = asyncio.get_running_loop().time() - t0
        await asyncio.sleep(0.3)
        assert not zero.done()  # priority 0 is never shed
        zero.cancel()
    assert waited < SPEC.slo.ttft_s
    assert [r[0] for r in refused] == ["low"] and refused[0][2] == 1
    assert count("team-a", -1, "shed") == 1 and count("team-a", -1, "admitted") == 1


async def test_a_higher_priority_leaves_first_and_a_light_key_before_a_heavy_one(
    classes: RequestClasses,
) -> None:
    gate = saturated(classes, [])
    order: list[str] = []

    async def one(rid: str, t: float, cls: RequestClass) -> None:
        classes.add(rid, cls)
        await gate.place(SPEC, POLICY, req(rid, t, prompt_tokens=100), frozenset())
        order.append(rid)

    async with running(gate):
        tasks = [asyncio.create_task(one(f"heavy{i}", i, RequestClass(0, "heavy", 100))) for i in range(4)]
        tasks.append(asyncio.create_task(one("light", 10, RequestClass(0, "light", 100))))
        tasks.append(asyncio.create_task(one("urgent", 11, RequestClass(3, "heavy", 100))))
        await asyncio.sleep(0.05)
        assert gate.held() == {"s": (6, 0)}
        gate.directory.load.report("e0", LoadReport(running=0, max_running=64))
        gate.notify()
        await asyncio.wait_for(asyncio.gather(*tasks), 2)
    # urgent first (priority 3); it was heavy's, so light (fewer tokens served) goes before heavy0
    assert order == ["urgent", "light", "heavy0", "heavy1", "heavy2", "heavy3"]
    labels = {"key": "light", "priority": "0"}
    assert REGISTRY.get_sample_value("llmfleet_scheduler_key_wait_seconds_count", labels) == 1


async def test_displace_refuses_the_lowest_held_request(classes: RequestClasses) -> None:
    refused: list[tuple[str, str, int]] = []
    gate = saturated(classes, refused)
    classes.add("a", RequestClass(0, "k", 16))
    classes.add("b", RequestClass(-2, "k", 16))
    async with running(gate):
        a = asyncio.create_task(gate.place(SPEC, POLICY, req("a", 0), frozenset()))
        b = asyncio.create_task(gate.place(SPEC, POLICY, req("b", 1), frozenset()))
        await asyncio.sleep(0.02)
        assert not gate.displace("s", -2, "k", 3)  # nothing below -2
        assert not gate.displace("other", 5, "k", 3)  # nothing of that service
        assert gate.displace("s", 1, "k", 3)
        with pytest.raises(Shed, match="a request of priority 1 took the place of this one"):
            await b
        assert gate.displace("s", 1, "k", 3)
        with pytest.raises(Shed):
            await a
    assert [(r[0], r[2]) for r in refused] == [("b", 3), ("a", 3)]
    assert count("k", -2, "refused") == 1


def test_admission_displaces_before_it_refuses() -> None:
    asked: list[tuple[str, int, str, int]] = []
    room = [True]

    def displace(service: str, priority: int, key: str, retry: int) -> bool:
        asked.append((service, priority, key, retry))
        return room.pop() if room else False

    a = Admission(max_waiting=1, displace=displace)
    a.admit("s", 10, priority=0)
    a.admit("s", 10, priority=5, key="k")  # displaced a held one
    with pytest.raises(Overloaded):
        a.admit("s", 10, priority=5, key="k")
    assert [x[:3] for x in asked] == [("s", 5, "k"), ("s", 5, "k")]


@dataclass
class GateRelay:
    """The relay's part that matters here: a request waits in the gate; a ColdStartTimeout from it
    fails the request UNAVAILABLE, as ``Relay._dispatch`` does."""

    metrics: SchedulerMetrics
    gate: CapacityGate

    async def run(self, rec: RequestRecord, _req, _deadline) -> None:
        try:
            await self.gate.place(SPEC, POLICY, req(rec.request_id, 0), frozenset())
        except ColdStartTimeout as e:
            await rec.fail(grpc.StatusCode.UNAVAILABLE, str(e), e.retry_after_s)
            return
        await rec.finish(rec.final_chunk(common_pb2.FINISH_REASON_LENGTH))


async def test_a_shed_request_ends_resource_exhausted_for_its_client(metrics: SchedulerMetrics) -> None:
    classes = RequestClasses(metrics)
    gate = saturated(classes, [])
    services = StaticView({"s": SPEC})
    servicer = SchedulerServicer(
        ClusterDirectory(services, StaticView({})), GateRelay(metrics, gate), classes=classes
    )
    gate.refuse = servicer.refuse
    async with running(gate):
        rec = servicer.open_request(scheduler_pb2.SubmitRequest(service="s", prompt="hi", priority=-3), None)
        with pytest.raises(RequestFailed) as e:
            async for _ in servicer.follow(rec):
                pass
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.retry_after_s == 1
    assert "priority -3 is sheddable" in e.value.details
    assert servicer.admission.waiting("s") == (0, 0)  # its place in admission is given back
    await servicer.close()
