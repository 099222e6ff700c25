"""The scheduler's capacity gate over a directory of fixed views: a request for a model no
engine hosts waits and wakes placement, then goes to the engine that loads it; past its cold-start
timeout it fails with a retry-after; a model too large for every engine fails at once; with late
binding, requests wait while every host is saturated and go, in order, to capacity that appears; a
cancelled waiting request leaves the queue and is never dispatched; early binding never holds."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from llmfleet.coord.desired import ModelEntry
from llmfleet.load import LoadReport
from llmfleet.metrics.control import SchedulerMetrics
from llmfleet.policies.capacity import Saturation, Unplaceable
from llmfleet.policies.dispatch import DispatchRequest, NoCandidate, make_dispatch_policy
from llmfleet.spec.defaults import Binding
from llmfleet.spec.services import ServiceSpec
from llmfleet.testing import StaticView
from llmfleet.types import ENGINE_ROLE, NodeRecord, Slo
from llmfleet_scheduler.capacity import CapacityGate, ColdStartTimeout
from llmfleet_scheduler.directory import ClusterDirectory
from prometheus_client import CollectorRegistry

GIB = 1 << 30
SPEC = ServiceSpec("s", "m", Slo(ttft_s=1.0, tpot_s=0.1))


def node(eid: str, *models: str, memory: int = 0) -> NodeRecord:
    return NodeRecord(
        eid, ENGINE_ROLE, f"127.0.0.1:{hash(eid) % 1000 + 20000}", memory_bytes=memory, models=models
    )


def directory(*nodes: NodeRecord, models: dict[str, ModelEntry] | None = None) -> ClusterDirectory:
    return ClusterDirectory(
        services_view=StaticView({"s": SPEC}),
        nodes_view=StaticView({n.node_id: n for n in nodes}),
        models_view=StaticView(models or {}),
    )


def nodes_of(d: ClusterDirectory) -> StaticView[NodeRecord]:
    """The directory's nodes, which a test changes (as placement or a scale-out would)."""
    view = d.nodes_view
    assert isinstance(view, StaticView)
    return view


def req(rid: str, t: float = 0.0, model: str = "m") -> DispatchRequest:
    return DispatchRequest(rid, model, "s", prompt_tokens=10, kv_bytes_per_token=1, arrival_s=t)


@contextlib.asynccontextmanager
async def running(gate: CapacityGate):
    task = asyncio.create_task(gate.run())
    try:
        yield gate
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def settle(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0.01)


async def test_a_cold_request_waits_wakes_placement_and_goes_to_the_engine_that_loads_it() -> None:
    d = directory(node("e0", "other"))
    woken: list[str] = []
    metrics = SchedulerMetrics(CollectorRegistry())
    gate = CapacityGate(d, on_wait=woken.append, metrics=metrics, poll_s=0.05)
    policy = make_dispatch_policy("round_robin")
    async with running(gate):
        task = asyncio.create_task(gate.place(SPEC, policy, req("r1"), frozenset()))
        await settle()
        assert not task.done() and woken == ["s"] and gate.held() == {"s": (1, 1)}
        nodes_of(d).items["e1"] = node("e1", "m")  # placement loaded it
        gate.notify()
        assert await asyncio.wait_for(task, 2) == "e1"
    assert gate.held() == {}
    got = {
        (x.name, x.labels.get("outcome")): x.value for m in metrics.cold_starts.collect() for x in m.samples
    }
    assert got[("llmfleet_scheduler_cold_starts_total", "served")] == 1


async def test_a_cold_request_times_out_with_a_retry_after() -> None:
    spec = ServiceSpec("s", "m", Slo(ttft_s=1.0, tpot_s=0.1), cold_start_timeout_s=0.2)
    gate = CapacityGate(directory(node("e0", "other")), poll_s=0.05)
    async with running(gate):
        with pytest.raises(ColdStartTimeout) as e:
            await asyncio.wait_for(
                gate.place(spec, make_dispatch_policy("round_robin"), req("r"), frozenset()), 3
            )
    assert e.value.retry_after_s >= 1 and "cold-start timeout" in str(e.value)
    assert gate.held() == {}


async def test_a_model_larger_than_every_engine_fails_at_once() -> None:
    d = directory(
        node("small", "other", memory=24 * GIB),
        models={"m": ModelEntry("m", "tiny://llama", sim_model="llama2-70b")},
    )
    gate = CapacityGate(d)
    with pytest.raises(Unplaceable, match=r"model 'm' needs .* largest engine, small, has 24.0 GiB"):
        await gate.place(SPEC, make_dispatch_policy("round_robin"), req("r"), frozenset())


async def test_cold_starts_off_fail_at_once_as_before() -> None:
    gate = CapacityGate(directory(node("e0", "other")), cold_start=False)
    with pytest.raises(NoCandidate, match="no engine hosts it"):
        await gate.place(SPEC, make_dispatch_policy("round_robin"), req("r"), frozenset())


def saturated_gate(binding: Binding) -> CapacityGate:
    d = directory(node("e0", "m"))
    d.load.report("e0", LoadReport(running=2, waiting=1, max_running=2))  # queue 3 = batch 2 + slack 1
    return CapacityGate(d, binding=binding, saturation=Saturation(queue_slack=1), poll_s=0.05)


async def test_late_binding_holds_while_saturated_and_serves_new_capacity_in_order() -> None:
    gate = saturated_gate("late")
    policy = make_dispatch_policy("round_robin")
    order: list[str] = []

    async def one(rid: str, t: float) -> str:
        eid = await gate.place(SPEC, policy, req(rid, t), frozenset())
        order.append(rid)
        return eid

    async with running(gate):
        tasks = [asyncio.create_task(one(r, t)) for r, t in (("a", 1.0), ("b", 2.0), ("c", 3.0))]
        await settle()
        assert not any(t.done() for t in tasks) and gate.held() == {"s": (3, 0)}
        nodes_of(gate.directory).items["e1"] = node("e1", "m")  # scaled out
        gate.directory.load.report("e1", LoadReport(running=0, max_running=2))
        gate.notify()
        got = await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert got == ["e1", "e1", "e1"] and order == ["a", "b", "c"]
    assert gate.directory.load.pending("e1") == 3  # recorded as each left the queue


async def test_early_binding_sends_to_a_saturated_engine_at_once() -> None:
    gate = saturated_gate("early")
    assert await gate.place(SPEC, make_dispatch_policy("round_robin"), req("a"), frozenset()) == "e0"


async def test_a_cancelled_waiting_request_leaves_the_queue_and_is_never_dispatched() -> None:
    gate = saturated_gate("late")
    policy = make_dispatch_policy("round_robin")
    async with running(gate):
        task = asyncio.create_task(gate.place(SPEC, policy, req("gone"), frozenset()))
        await settle()
        assert gate.held() == {"s": (1, 0)}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert gate.held() == {}
        gate.directory.load.report("e0", LoadReport(running=0, max_running=2))  # room now
        gate.notify()
        await settle()
    assert gate.directory.load.pending("e0") == 0


async def test_a_request_behind_a_queue_waits_its_turn() -> None:
    gate = saturated_gate("late")
    policy = make_dispatch_policy("round_robin")
    async with running(gate):
        first = asyncio.create_task(gate.place(SPEC, policy, req("first", 1.0), frozenset()))
        await settle()
        # room for exactly one: the queued request goes, not the newcomer
        gate.directory.load.report("e0", LoadReport(running=2, waiting=0, max_running=2))
        second = asyncio.create_task(gate.place(SPEC, policy, req("second", 2.0), frozenset()))
        gate.notify()
        assert await asyncio.wait_for(first, 2) == "e0"
        await settle()
        assert not second.done()
        second.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await second


def test_an_unknown_binding_is_refused() -> None:
    with pytest.raises(ValueError, match="binding"):
        # a wrong value on purpose: the check under test
        CapacityGate(directory(), binding="sometimes")  # type: ignore[arg-type]


async def test_a_model_the_placement_leader_leaves_out_fails_at_once() -> None:
    d = directory(node("e0", "other"))
    d.unplaced_view = StaticView({"": {"m": "the static placement lists model 'm' on no engine"}})
    gate = CapacityGate(d)
    with pytest.raises(Unplaceable, match="placement does not place model 'm': the static placement"):
        await gate.place(SPEC, make_dispatch_policy("round_robin"), req("r"), frozenset())
