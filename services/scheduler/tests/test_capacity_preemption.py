"""Late binding with preemption: a saturated engine still takes a request its core would preempt for
(a higher priority than one placed there; under vtc, an API key below its fair share of the engine's
slots), and only as long as that holds (``preempt_room``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llmfleet.load import LoadReport
from llmfleet.metrics.control import SchedulerMetrics
from llmfleet.policies.capacity import Saturation
from llmfleet.policies.dispatch import DispatchRequest, make_dispatch_policy
from llmfleet.policies.request.preemption import PreemptionRule
from llmfleet.spec.services import ServiceSpec
from llmfleet.testing import StaticView
from llmfleet.types import ENGINE_ROLE, NodeRecord, Slo
from llmfleet_scheduler.capacity import CapacityGate
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.priorities import RequestClass, RequestClasses
from prometheus_client import CollectorRegistry

SPEC = ServiceSpec("s", "m", Slo(ttft_s=5.0, tpot_s=0.1))
POLICY = make_dispatch_policy("round_robin")
METRICS = SchedulerMetrics(CollectorRegistry())


def gate_over(
    held: dict[str, RequestClass], slots: int, fairness: str = "vtc", **gate: Any
) -> tuple[CapacityGate, RequestClasses]:
    """A late-binding gate (no slack) over one engine running ``held`` (its report names them)."""
    d = ClusterDirectory(
        services_view=StaticView({"s": SPEC}),
        nodes_view=StaticView({"e0": NodeRecord("e0", ENGINE_ROLE, "127.0.0.1:20001", models=("m",))}),
        models_view=StaticView({}),
    )
    d.load.report("e0", LoadReport(running=len(held), max_running=slots, request_ids=frozenset(held)))
    classes = RequestClasses(METRICS)
    for rid, cls in held.items():
        classes.add(rid, cls)
    gate = CapacityGate(
        d, binding="late", saturation=Saturation(queue_slack=0), poll_s=0.05, classes=classes,
        metrics=METRICS, fairness=fairness, **gate,  # type: ignore[arg-type]
    )  # fmt: skip
    return gate, classes


async def place(gate: CapacityGate, classes: RequestClasses, rid: str, cls: RequestClass) -> str | None:
    """Where ``rid`` goes at once (None: it is held, and given up)."""
    classes.add(rid, cls)
    task = asyncio.create_task(
        gate.place(SPEC, POLICY, DispatchRequest(rid, "m", "s", 10, arrival_s=1.0), frozenset())
    )
    done, _ = await asyncio.wait({task}, timeout=0.05)
    if not done:
        task.cancel()
        return None
    gate.directory.load.dispatched(task.result(), rid)  # as the relay records it
    return task.result()


async def test_a_higher_priority_goes_to_a_saturated_engine_until_its_band_fills_it() -> None:
    gate, classes = gate_over({"l1": RequestClass(0), "l2": RequestClass(0)}, slots=2)
    assert await place(gate, classes, "x0", RequestClass(0)) is None  # an equal priority waits
    assert await place(gate, classes, "h1", RequestClass(1)) == "e0"
    assert await place(gate, classes, "h2", RequestClass(1)) == "e0"
    assert await place(gate, classes, "h3", RequestClass(1)) is None  # priority 1 holds both slots


@pytest.mark.parametrize("fairness", ["vtc", "none"])
async def test_a_light_key_goes_to_an_engine_the_heavy_key_fills(fairness: str) -> None:
    heavy = {f"h{i}": RequestClass(0, "heavy") for i in range(4)}
    gate, classes = gate_over(heavy, slots=4, fairness=fairness)
    got = [await place(gate, classes, f"l{i}", RequestClass(0, "light")) for i in range(3)]
    if fairness == "vtc":
        assert got == ["e0", "e0", None]  # up to its fair share (2 of 4), counting those it sent
    else:
        assert got == [None, None, None]  # no fairness: priorities only


async def test_a_light_key_behind_a_held_heavy_backlog_leaves_out_of_turn() -> None:
    heavy = {f"h{i}": RequestClass(0, "heavy") for i in range(4)}
    gate, classes = gate_over(heavy, slots=4)
    held = [asyncio.create_task(place(gate, classes, f"q{i}", RequestClass(0, "heavy"))) for i in range(3)]
    await asyncio.sleep(0)  # the heavy key's backlog is held first
    task = asyncio.create_task(gate.run())
    try:
        classes.add("light", RequestClass(0, "light"))
        got = await asyncio.wait_for(
            gate.place(SPEC, POLICY, DispatchRequest("light", "m", "s", 10, arrival_s=2.0), frozenset()), 1.0
        )
        assert got == "e0"  # sent to the saturated engine past the held heavy requests
        assert [await t for t in held] == [None, None, None]
    finally:
        task.cancel()


@pytest.mark.parametrize("window_s", [10.0, 0.0])
async def test_a_light_key_that_held_less_than_its_share_bursts_past_it(window_s: float) -> None:
    """The gate keeps each engine's tenants' credit (fed what it placed there whenever it weighs the
    engine): the light key held 1 slot of its entitled 2 for 10 s, so a third request goes through."""
    now = [0.0]
    placed = {"l0": RequestClass(0, "light"), **{f"h{i}": RequestClass(0, "heavy") for i in range(3)}}
    gate, classes = gate_over(
        placed, slots=4, preemption=PreemptionRule(credit_window_s=window_s), clock=lambda: now[0]
    )
    assert await place(gate, classes, "l1", RequestClass(0, "light")) == "e0"  # below its share
    now[0] = 10.0
    got = await place(gate, classes, "l2", RequestClass(0, "light"))  # at its share: credit decides
    assert got == ("e0" if window_s else None)
    gate.forget("e0")
    assert await place(gate, classes, "l3", RequestClass(0, "light")) is None  # the engine's credit went
