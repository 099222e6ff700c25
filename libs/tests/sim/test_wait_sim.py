"""Requests wait for capacity in the simulator as in the live scheduler: a request for a
model no instance serves wakes the placement loop and is served once the model loads (or fails at
once with cold starts off, or after its cold-start timeout when nothing places it); with late binding
a burst waits in the scheduler and capacity added later serves part of it, where early binding leaves
the whole queue on the first instance. Costs are the conftest's linear ones."""

from __future__ import annotations

from llmfleet.policies.capacity import Saturation
from llmfleet.policies.dispatch import RoundRobin
from llmfleet.policies.placement import GpuPool, make_placement_policy
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import Fcfs
from llmfleet.sim.replan import PlacementLoop
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import EngineSettings, SimService
from llmfleet.types import Slo
from llmfleet.workload import WorkloadRequest as W

S7 = SimService("s", "llama2-7b")
S8 = SimService("t", "llama3-8b", Slo(ttft_s=1.0, tpot_s=0.1))


def make(tiny, plan, services=(S7, S8), engine=None) -> Simulator:
    spec = tiny.spec(services=services, cluster="2xA100-80GB", engine=engine)
    return Simulator(spec, plan, Fcfs, RoundRobin(), tiny.book(spec))


def cold_work() -> list[W]:
    return [W("a", 0.0, 100, 5, "s")] + [W(f"t{i}", 0.5 + 0.01 * i, 100, 5, "t") for i in range(10)]


def test_a_cold_request_wakes_the_placement_loop_and_is_served(tiny) -> None:
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)])
    loop = PlacementLoop(
        make_placement_policy("dedicated_even"), GpuPool("A100-80GB", 2, 8), interval_s=100.0
    )
    loop.install(sim, 0.0)
    res = sim.run(cold_work(), strict_services=True)
    cold = [r for r in res.records if r.service == "t"]
    assert all(r.done and not r.failed for r in cold), [r.failed for r in cold]
    assert max(r.finish_s for r in cold) < 5.0  # not one 100 s interval later
    assert loop.decisions[0].t == 0.5 and loop.decisions[0].status == "applied"


def test_cold_starts_off_fail_at_once(tiny) -> None:
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)])
    loop = PlacementLoop(
        make_placement_policy("dedicated_even"), GpuPool("A100-80GB", 2, 8), interval_s=100.0
    )
    loop.install(sim, 0.0)
    sim.fleet.cold_start = False
    res = sim.run(cold_work(), strict_services=True)
    assert all("no engine available" in r.failed for r in res.records if r.service == "t")


def test_a_model_nothing_places_fails_after_its_cold_start_timeout(tiny) -> None:
    slow = SimService("t", "llama3-8b", Slo(ttft_s=1.0, tpot_s=0.1), cold_start_timeout_s=2.0)
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)], services=(S7, slow))
    woken: list[float] = []
    sim.fleet.wake = woken.append  # a loop that never places the model
    res = sim.run(cold_work(), strict_services=True)
    cold = [r for r in res.records if r.service == "t"]
    assert all("cold-start timeout" in r.failed for r in cold)
    assert woken and woken[0] == 0.5
    assert res.records[0].done  # the other service is untouched
    assert res.end_s >= 2.5  # each waited its 2 s


def burst(sim: Simulator) -> dict[str, int]:
    sim.at(0.05, lambda s, now: s.fleet.add_instance(InstancePlan("i1", ("llama2-7b",), 1), now + 0.5))
    res = sim.run([W(f"r{i}", 0.0, 100, 40, "s") for i in range(24)], strict_services=True)
    assert all(r.done for r in res.records)
    out: dict[str, int] = {}
    for r in res.records:
        out[r.instance] = out.get(r.instance, 0) + 1
    return out


def test_late_binding_lets_added_capacity_serve_the_burst_queue(tiny) -> None:
    engine = EngineSettings(max_running=4)
    early = burst(make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)], services=(S7,), engine=engine))
    late_sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)], services=(S7,), engine=engine)
    late_sim.fleet.set_binding("late", Saturation(queue_slack=2))
    late = burst(late_sim)
    assert early == {"i0": 24}  # bound on arrival: the queue stays where it landed
    assert late.get("i1", 0) >= 6 and late["i0"] + late["i1"] == 24


def test_moving_queued_requests_lets_added_capacity_serve_the_burst_queue(tiny) -> None:
    from llmfleet.sim.migration import QueueMoveLoop

    engine = EngineSettings(max_running=4)
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)], services=(S7,), engine=engine)
    loop = QueueMoveLoop(Saturation(queue_slack=2), epoch_s=0.25)
    loop.install(sim)
    served = burst(sim)  # bound early to i0, then moved to i1 once it serves
    assert served.get("i1", 0) >= 6 and loop.stats.executed == served["i1"]


def test_the_first_request_held_for_a_saturated_model_wakes_the_placement_loop(tiny) -> None:
    engine = EngineSettings(max_running=4)
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)], services=(S7,), engine=engine)
    sim.fleet.set_binding("late", Saturation(queue_slack=2))
    loop = PlacementLoop(
        make_placement_policy("dedicated_even"), GpuPool("A100-80GB", 2, 8), interval_s=100.0
    )
    loop.install(sim, 0.0)
    sim.run([W(f"r{i}", 0.0, 100, 40, "s") for i in range(24)], strict_services=True)
    assert loop.decisions[0].t == 0.0  # not 100 s later


def test_late_binding_holds_arrivals_whose_queued_prompts_would_fill_the_kv(tiny) -> None:
    """The room check counts the KV the queued prompts will take (as a live engine reports it) under a
    dispatcher that reads no KV: a burst of long prompts that no batch or queue bound stops is held
    once the queued prompts reach ``kv_fraction`` of the pool, and none of it is lost."""
    engine = EngineSettings(max_running=4)
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)], services=(S7,), engine=engine)
    sim.fleet.set_binding("late", Saturation(queue_slack=100))
    cap_tokens = sim.fleet.instances["i0"].kv_capacity_bytes // sim.fleet.kv_bytes_per_token["llama2-7b"]
    n = int(2 * cap_tokens // 3000) + 1  # twice the pool in prompts
    res = sim.run([W(f"r{i}", 0.0, 3000, 4, "s") for i in range(n)], strict_services=True)
    at_once = [r for r in res.records if r.dispatched_s == 0.0]
    assert all(r.done for r in res.records) and len(res.records) == n
    assert len(at_once) == int(0.95 * cap_tokens / 3000) + 1  # up to the first past 95 % of the pool
