"""Controller hooks: periodic ticks and request moves between instances."""

from __future__ import annotations

import pytest
from llmfleet.policies.dispatch import DispatchNeeds, EngineCandidate, NoCandidate
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.sim.spec import EngineSettings, SimService
from llmfleet.workload import WorkloadRequest as W

approx = pytest.approx


class Always:
    """A dispatcher that sends everything to one instance (a DispatchPolicy by duck typing)."""

    name = "always"
    needs = DispatchNeeds()  # reads no load

    def __init__(self, target: str) -> None:
        self.target = target

    def choose(self, model, candidates: list[EngineCandidate], exclude=frozenset(), request=None) -> str:
        if not any(c.engine_id == self.target for c in candidates):
            raise NoCandidate(self.target)
        return self.target


def test_every_is_called_at_the_expected_times_and_stops(tiny):
    sim = tiny.sim()
    calls: list[float] = []
    sim.every(1.0, lambda s, now: calls.append(now))
    # a: 0.21 + Σ_{i=1}^{199} (0.011 + 1e-4·(100 + i)) = 0.21 + 2.189 + 1.99 + 1.99 = 6.379 s
    res = sim.run([W("a", 0.0, 100, 200, "s")])
    end = res.records[0].finish_s
    assert end == approx(6.379, abs=1e-9)
    assert calls[:6] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    # no tick after the first one past the end of the work
    assert len(calls) <= 7 and all(t < end + 1.0 for t in calls)


def test_every_ticks_through_idle_gaps_before_later_arrivals(tiny):
    sim = tiny.sim()
    calls: list[float] = []
    sim.every(2.0, lambda s, now: calls.append(now))
    sim.every(5.0, lambda s, now: calls.append(-now))  # several hooks, each on its own period
    sim.run([W("a", 1.0, 10, 2, "s"), W("b", 9.5, 10, 2, "s")])  # idle from ~1.12 to 9.5
    ticks = [t for t in calls if t > 0]
    assert ticks[:5] == [3.0, 5.0, 7.0, 9.0, 11.0]  # from the first arrival, while arrivals are pending
    assert len(ticks) == 5  # b ends at ~9.63: the tick at 11 is the last
    assert [-t for t in calls if t < 0] == [6.0, 11.0]
    with pytest.raises(ValueError, match="period"):
        sim.every(0.0, lambda s, now: None)


def test_move_a_waiting_request(tiny):
    """i0 has one slot: b waits behind a; at t = 0.5 a hook moves b to i1 (0.1 s transfer)."""
    sim = tiny.sim(
        engine=EngineSettings(max_running=1, max_batch_requests=1), instances=2, dispatch=Always("i0")
    )
    answers: dict[str, bool] = {}

    def hook(s, now):
        if now == 0.5:
            assert s.fleet.instance_of("b") == "i0" and s.fleet.instance_of("a") == "i0"
            answers["b"] = s.fleet.move_request("b", "i1", 0.1, now)
            answers["again"] = s.fleet.move_request("b", "i0", 0.1, now)  # in transit: not on any instance
            answers["unknown"] = s.fleet.move_request("zz", "i1", 0.1, now)
            answers["bad dst"] = s.fleet.move_request("b", "nope", 0.1, now)

    sim.every(0.5, hook)
    res = sim.run([W("a", 0.0, 100, 100, "s"), W("b", 0.01, 100, 5, "s")])
    a, b = res.records
    assert answers == {"b": True, "again": False, "unknown": False, "bad dst": False}
    assert (a.instance, a.moves) == ("i0", 0)
    assert (b.instance, b.moves) == ("i1", 1)
    # b lands on the idle i1 at 0.6 and runs alone there: 0.21 of prefill then 0.085 of decodes
    assert b.first_token_s == approx(0.6 + 0.21, abs=1e-12)
    assert b.finish_s == approx(0.6 + 0.295, abs=1e-12)
    assert a.done and b.done
    assert all(i.alloc.used_blocks == 0 for i in sim.instances.values())
    assert res.instances[1]["iterations"] == 5


def test_a_request_in_the_step_in_flight_leaves_when_the_step_ends(tiny):
    """a decodes on i0 (continuous batching: it is in every step); the hook at 0.5 asks to move it —
    accepted, it leaves at the end of the step in flight and finishes on i1; asking twice is refused."""
    sim = tiny.sim(instances=2, dispatch=Always("i0"))
    answers: dict[str, bool] = {}

    def hook(s, now):
        if now == 0.5:
            answers["a"] = s.fleet.move_request("a", "i1", 0.1, now)
            answers["again"] = s.fleet.move_request("a", "i1", 0.1, now)  # already leaving

    sim.every(0.5, hook)
    res = sim.run([W("a", 0.0, 100, 100, "s")])
    (a,) = res.records
    assert answers == {"a": True, "again": False}
    assert (a.instance, a.moves) == ("i1", 1) and a.done and a.output_tokens == 100
    assert all(i.alloc.used_blocks == 0 for i in sim.instances.values())


def test_move_to_an_instance_without_the_model_is_refused(tiny):
    svcs = [SimService("s", "llama2-7b"), SimService("t", "llama3-8b")]
    plan = [InstancePlan("i0", ("llama2-7b",), 1), InstancePlan("i1", ("llama3-8b",), 1)]
    sim = tiny.sim(engine=EngineSettings(max_running=1, max_batch_requests=1), services=svcs, plan=plan)
    out = []

    def hook(s, now):
        if not out:
            out.append(s.fleet.move_request("b", "i1", 0.0, now))
            out.append(s.fleet.instance_of("b"))

    sim.every(0.1, hook)
    res = sim.run([W("a", 0.0, 100, 20, "s"), W("b", 0.01, 100, 5, "s")], strict_services=True)
    assert out == [False, "i0"]
    assert all(r.done and r.moves == 0 and r.instance == "i0" for r in res.records)


def _kv_move_scenario(tiny, check_kv: list | None = None):
    """i0 hosts llama2-7b and llama3-8b, i1 llama3-8b. a (8b) runs; c (8b) joins its batch; when a is
    done, b (7b, older than c) prefills while c keeps its KV on i0 outside the batch in flight: a hook
    then moves c, with its KV, to i1."""
    svcs = [SimService("s", "llama2-7b"), SimService("t", "llama3-8b")]
    plan = [InstancePlan("i0", ("llama2-7b", "llama3-8b"), 1), InstancePlan("i1", ("llama3-8b",), 1)]
    sim = tiny.sim(services=svcs, plan=plan, dispatch=Always("i0"), fast_forward=False)
    moved: dict = {}

    def hook(s, now):
        if check_kv is not None:
            check_kv.extend((now, *m) for m in tiny.kv_mismatches(s))
        i0 = s.instances["i0"]
        flying = {r.sched.request_id for r in i0.work.members} if i0.work else set()
        if not moved and "c" in i0.running and "c" not in flying:
            moved["held"] = i0.alloc.num_tokens("c")
            moved["context"] = i0.running["c"].sched.context_tokens
            moved["ok"] = s.fleet.move_request("c", "i1", 0.0, now)
            moved["at"] = now

    sim.every(0.01, hook)
    work = [W("a", 0.0, 100, 3, "t"), W("b", 0.001, 100, 3, "s"), W("c", 0.002, 100, 10, "t")]
    return sim, sim.run(work, strict_services=True), moved


def test_move_a_running_request_with_its_kv(tiny):
    sim, res, moved = _kv_move_scenario(tiny)
    c = next(r for r in res.records if r.request_id == "c")
    assert moved["ok"] and moved["held"] == 101 and moved["context"] == 102  # prompt 100, 2 tokens out
    assert (c.instance, c.moves, c.produced, c.preemptions) == ("i1", 1, 10, 0)
    assert c.finish_s > moved["at"] and all(r.done for r in res.records)
    assert "c" not in sim.instances["i0"].alloc  # the source freed it
    # the KV came along: i1 decodes c right away (no re-prefill), 8 more decodes → 8 iterations there
    assert res.instances[1]["iterations"] == 8
    assert all(i.alloc.used_blocks == 0 for i in sim.instances.values())


def test_moved_request_keeps_its_kv_length(tiny):
    bad: list = []
    _sim, _res, moved = _kv_move_scenario(tiny, check_kv=bad)
    assert moved["ok"]
    assert bad == []
