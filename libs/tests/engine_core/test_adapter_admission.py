"""The engine core's LoRA adapter rule: a request takes its adapter's slot when the core admits it into a
step and gives it back when it leaves the running set; one whose adapter finds every slot held by other
adapters' running requests waits (never refused) while later requests go ahead."""

from __future__ import annotations

from llmfleet.engine_core import (
    AdapterGate,
    AdapterSlots,
    AdapterUnavailable,
    CoreRequest,
    EngineCore,
    EngineLimits,
    StepPlan,
)
from llmfleet.kvblocks import BlockAllocator, KvShape
from llmfleet.policies.request import Fcfs, SchedRequest

SHAPE = KvShape(num_layers=1, num_kv_heads=1, head_dim=4)  # 32 B/token
T = 4  # tokens per block


def make_core(slots: AdapterSlots, loads: list[str], limits: EngineLimits | None = None) -> EngineCore:
    alloc = BlockAllocator(64, 32 * T, watermark=0.0)
    alloc.register_model("base", SHAPE)
    gate = AdapterGate(lambda r: slots, lambda r, slot: loads.append(f"{r.adapter}@{slot}"))
    core = EngineCore(Fcfs(), alloc, limits or EngineLimits(), adapters=gate)
    core.add_model("base")
    return core


def req(rid: str, adapter: str | None, t: float, out: int = 3, priority: int = 0) -> CoreRequest:
    sched = SchedRequest(rid, "s", "base", t, 6, out, request_priority=priority)
    return CoreRequest(sched, 6, out, adapter=adapter)


def step(core: EngineCore, now: float) -> StepPlan:
    plan = core.schedule(now)
    assert plan is not None
    core.complete(plan, now, 0.01, finished=[r for r in plan.members if r.produced + 1 >= r.max_tokens])
    return plan


def test_a_request_waits_for_a_slot_while_later_ones_go_ahead() -> None:
    slots, loads = AdapterSlots(1), []
    core = make_core(slots, loads)
    for r in [req("a", "x", 0.0, out=4), req("b", "y", 0.1), req("c", None, 0.2), req("d", "x", 0.3)]:
        core.add(r, 0.3)
    admitted: list[str] = []
    now = 1.0
    while core.has_work():
        plan = step(core, now)
        admitted += [r.request_id for r in plan.prefills]
        if now == 1.0:  # b waits: x holds the only slot, pinned by a and d
            assert core.waiting.keys() == {"b"} and slots.pins("x") == 2
        now += 1.0
    assert admitted == ["a", "c", "d", "b"]  # FCFS but for b, which waited for x's requests to end
    assert loads == ["x@0", "y@0"] and slots.resident == ("y",) and slots.pins("y") == 0
    assert not core.failed


def test_a_preempted_request_releases_its_slot_and_takes_it_again() -> None:
    slots, loads = AdapterSlots(1), []
    core = make_core(slots, loads, EngineLimits(max_running=1))
    a = req("a", "x", 0.0, out=5)
    core.add(a, 0.0)
    step(core, 0.0)
    assert (a.adapter_slot, slots.pins("x")) == (0, 1)
    core.add(req("h", None, 1.0, out=2, priority=1), 1.0)  # a higher priority: a is preempted for it
    plan = step(core, 1.0)
    assert [r.request_id for r in plan.preempted] == ["a"] and [r.request_id for r in plan.prefills] == ["h"]
    assert (a.adapter_slot, slots.pins("x")) == (-1, 0)  # released while it waits
    while "a" not in core.running:
        step(core, 2.0)
    assert (a.adapter_slot, slots.pins("x")) == (0, 1)  # re-admitted: it holds it again
    while core.has_work():
        step(core, 3.0)
    assert slots.pins("x") == 0 and loads == ["x@0"]  # resident all along: one load


def test_a_request_whose_adapter_is_gone_fails_at_admission() -> None:
    loads: list[str] = []

    def gone(r: CoreRequest, slot: int) -> None:
        raise AdapterUnavailable(f"adapter {r.adapter!r} is no longer registered here")

    alloc = BlockAllocator(64, 32 * T, watermark=0.0)
    alloc.register_model("base", SHAPE)
    slots = AdapterSlots(1)
    core = EngineCore(Fcfs(), alloc, EngineLimits(), adapters=AdapterGate(lambda r: slots, gone))
    core.add_model("base")
    core.add(req("a", "x", 0.0), 0.0)
    core.add(req("c", None, 0.0), 0.0)
    plan = step(core, 0.0)
    assert [r.request_id for r in plan.prefills] == ["c"]
    ((r, why),) = core.drain_failed()
    assert r.request_id == "a" and "no longer registered" in why
    assert slots.resident == () and not loads


def test_a_higher_priority_request_preempts_the_holders_of_another_adapter_for_a_slot() -> None:
    slots, loads = AdapterSlots(2), []
    core = make_core(slots, loads)
    for r in [req("x1", "x", 0.0, out=9), req("x2", "x", 0.1, out=9), req("y1", "y", 0.2, out=9)]:
        core.add(r, 0.2)
    step(core, 0.2)
    assert (slots.pins("x"), slots.pins("y")) == (2, 1)  # every slot held
    core.add(req("h", "z", 1.0, out=2, priority=1), 1.0)
    plan = step(core, 1.0)
    # y's one holder is preempted (fewer than x's two); h takes y's slot
    assert [r.request_id for r in plan.preempted] == ["y1"] and [r.request_id for r in plan.prefills] == ["h"]
    assert slots.slot("z") == 1 and slots.pins("x") == 2 and loads == ["x@0", "y@1", "z@1"]
    while core.has_work():
        step(core, 2.0)
    assert not core.failed and core.preemptions == 1


def test_equal_priority_waits_for_a_slot_without_preempting() -> None:
    slots, loads = AdapterSlots(1), []
    core = make_core(slots, loads)
    core.add(req("x1", "x", 0.0, out=4, priority=1), 0.0)
    step(core, 0.0)
    core.add(req("h", "z", 1.0, out=2, priority=1), 1.0)  # the same priority: no preemption
    plan = step(core, 1.0)
    assert not plan.preempted and "h" in core.waiting
    while core.has_work():
        step(core, 2.0)
    assert core.preemptions == 0 and loads == ["x@0", "z@0"]
