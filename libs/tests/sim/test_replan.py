"""The placement loop inside a simulation (llmfleet.sim.replan) with scripted planners."""

from __future__ import annotations

from typing import ClassVar

import pytest
from llmfleet.policies.dispatch import RoundRobin
from llmfleet.policies.placement import (
    EngineSlot,
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementInfeasible,
    PlacementNeeds,
    PlannerReport,
    PlanScore,
    assign_plan,
    moves,
    performance,
)
from llmfleet.policies.request import Fcfs
from llmfleet.sim.partition import partition_blocker
from llmfleet.sim.replan import PlacementLoop, plan_summary
from llmfleet.sim.run import PolicyBundle, simulate
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import SimService
from llmfleet.workload import Workload, per_service_arrivals
from llmfleet.workload import WorkloadRequest as W

approx = pytest.approx
S7, S8 = SimService("s", "llama2-7b"), SimService("t", "llama3-8b")
A = [InstancePlan("x", ("llama2-7b",), 1), InstancePlan("y", ("llama3-8b",), 1)]
B = [InstancePlan("x", ("llama2-7b", "llama3-8b"), 1), InstancePlan("y", ("llama2-7b",), 1)]


class Scripted(PlannerReport):
    """A planner replaying ``script`` (plans, exceptions to raise, or None: keep the current plan)."""

    name = "scripted"
    needs: ClassVar[PlacementNeeds] = PlacementNeeds()

    def __init__(self, *script) -> None:
        self.script = list(script)
        self.seen: list[tuple[float, list, PlacementContext]] = []
        self.last_score: PlanScore | None = None

    def place(self, gpus, services, context=None):
        self.seen.append((context.now, list(services), context))
        step = self.script.pop(0) if self.script else None
        if isinstance(step, Exception):
            raise step
        return list(context.current) if step is None else list(step)


def make(tiny, plan=A, services=(S7, S8), cluster="2xA100-80GB") -> Simulator:
    spec = tiny.spec(services=services, cluster=cluster)
    return Simulator(spec, plan, Fcfs, RoundRobin(), tiny.book(spec))


def pool_of(spec) -> GpuPool:
    return GpuPool(spec.cluster.hw.name, spec.cluster.count)


def steady(n: int, gap: float, services=("s", "t"), prompt=100, output=5) -> list[W]:
    return [W(f"r{i}", i * gap, prompt, output, services[i % len(services)]) for i in range(n)]


def test_an_infeasible_plan_keeps_the_last_one_and_is_logged(tiny):
    sim = make(tiny)
    planner = Scripted(B, PlacementInfeasible("llama2-70b does not fit"), None)
    loop = PlacementLoop(planner, pool_of(sim.spec), interval_s=2.0)
    loop.install(sim, 0.0)
    res = sim.run(steady(60, 0.1), strict_services=True)
    first, bad, third = loop.decisions[:3]
    assert [d.t for d in loop.decisions[:3]] == [2.0, 4.0, 6.0]
    assert (first.status, first.error, first.moves, first.plan) == ("applied", "", 1, plan_summary(B))
    assert (bad.status, bad.error) == ("infeasible", "llama2-70b does not fit")
    assert bad.plan == first.plan and bad.gpus_in_use == 2
    assert (third.status, third.moves, third.plan) == ("unchanged", 0, first.plan)
    assert sorted(m for _, ms in sim.fleet.hosting().values() for m in ms) == sorted(
        m for p in B for m in p.models
    )
    assert all(r.done and r.produced == r.output_tokens for r in res.records)


def test_alternating_plans_make_the_moves_assign_plan_predicts(tiny):
    sim = make(tiny)
    planner = Scripted(B, A, B, A)
    loop = PlacementLoop(planner, pool_of(sim.spec), interval_s=2.0)
    before: list[dict] = []
    tick = loop.tick

    def spy(s, now):
        before.append({i: ms for i, (_, ms) in s.fleet.hosting().items()})
        d = tick(s, now)
        after = {i: ms for i, (_, ms) in s.fleet.hosting().items()}
        slots = [EngineSlot(i, 1, ms) for i, ms in sorted(before[-1].items())]
        if len(before) <= 4:
            want = assign_plan([B, A][(len(before) - 1) % 2], slots)
            assert {i: set(ms) for i, ms in after.items()} == {i: set(ms) for i, ms in want.items()}
            assert d.moves == moves(before[-1], want) == 1
        return d

    loop.tick = spy
    loop.install(sim, 0.0)
    res = sim.run(steady(100, 0.1, output=20), strict_services=True)
    assert [d.moves for d in loop.decisions[:4]] == [1, 1, 1, 1]
    assert loop.decisions[0].changes == ["y: +llama2-7b"] and loop.decisions[1].changes == ["y: -llama2-7b"]
    assert all(r.done and r.produced == r.output_tokens and not r.failed for r in res.records)
    assert sum(r.moves for r in res.records) > 0  # y's 7b requests moved to x when 7b left y
    assert res.gpu_log == [(0.0, 2)]  # the same two GPUs throughout


def test_hysteresis_applies_a_change_proposed_twice_in_a_row_or_at_once_when_urgent(tiny):
    sim = make(tiny)
    planner = Scripted(B, A, B, B)  # A is the plan in force
    loop = PlacementLoop(planner, pool_of(sim.spec), interval_s=2.0, confirm_intervals=2)
    loop.install(sim, 0.0)
    sim.run(steady(100, 0.1), strict_services=True)
    assert [d.status for d in loop.decisions[:4]] == ["proposed", "unchanged", "proposed", "applied"]
    assert (
        loop.decisions[0].plan == plan_summary(A)
        and "applied if proposed for 2" in loop.decisions[0].changes[0]
    )
    assert loop.decisions[3].plan == plan_summary(B)

    only7 = make(tiny, plan=[InstancePlan("x", ("llama2-7b",), 1)])
    loop = PlacementLoop(Scripted(A), pool_of(only7.spec), interval_s=2.0, confirm_intervals=2)
    loop.install(only7, 0.0)
    res = only7.run(steady(40, 0.1, services=("s",)), strict_services=True)
    assert loop.decisions[0].status == "applied"  # llama3-8b was unserved: no waiting
    assert loop.decisions[0].changes == ["n1.1.0: new tp1 [llama3-8b]"] and res.gpu_log == [
        (0.0, 1),
        (2.0, 2),
    ]


def test_dispatch_infeasible_counts_reach_the_planner_per_model(tiny):
    class Counting(RoundRobin):
        """Round robin that counts the 7b requests as infeasible (as Aladdin's best fit does)."""

        def __init__(self) -> None:
            super().__init__()
            self.infeasible = 0

        def choose(self, model, candidates, exclude=frozenset(), request=None):
            self.infeasible += model == "llama2-7b"
            return super().choose(model, candidates, exclude, request)

    spec = tiny.spec(services=(S7, S8))
    sim = Simulator(spec, A, Fcfs, Counting(), tiny.book(spec))
    planner = Scripted()
    PlacementLoop(planner, pool_of(spec), interval_s=2.0).install(sim, 0.0)
    sim.run(steady(40, 0.1), strict_services=True)
    first, second = planner.seen[0][2], planner.seen[1][2]
    assert first.infeasible == {"llama2-7b": 11}  # r0, r2, ..., r20 by t = 2 s
    assert second.infeasible == {"llama2-7b": 9}  # only those since the last tick


def test_a_plan_larger_than_the_cluster_is_infeasible(tiny):
    sim = make(tiny)
    too_big = [*A, InstancePlan("z", ("llama2-7b",), 1)]
    loop = PlacementLoop(Scripted(too_big), pool_of(sim.spec), interval_s=1.0)
    loop.install(sim, 0.0)
    sim.run(steady(20, 0.1), strict_services=True)
    assert loop.decisions[0].status == "infeasible" and "3 GPUs, the cluster has 2" in loop.decisions[0].error


def test_the_loop_sees_a_rate_change_in_a_time_varying_workload(tiny):
    arr = per_service_arrivals({"s": [(20.0, 2.0), (20.0, 10.0)], "t": 1.0}, 40.0, seed=5)
    reqs = [W(f"{svc}-{i}", float(t), 20, 4, svc) for svc, ts in arr.items() for i, t in enumerate(ts)]
    work = Workload(tuple(reqs)).requests
    sim = make(tiny)
    planner = Scripted()
    loop = PlacementLoop(planner, pool_of(sim.spec), interval_s=5.0, window_s=5.0)
    loop.install(sim, work[0].arrival_s)
    sim.run(work, strict_services=True)
    rate = {round(now - work[0].arrival_s): {s.name: s for s in loads} for now, loads, _ in planner.seen}
    low = [rate[t]["s"].rate_rps for t in (5, 10, 15)]
    high = [rate[t]["s"].rate_rps for t in (25, 30, 35)]
    assert max(low) < 4.0 < 7.0 < min(high)  # 2 req/s, then 10 req/s
    s = rate[30]["s"]
    assert (s.mean_prompt_tokens, s.std_prompt_tokens, s.mean_output_tokens) == (20.0, 0.0, 4.0)
    assert s.attainment == 1.0 and s.normalized_latency is not None and s.slo == S7.slo
    assert rate[30]["t"].rate_rps == approx(1.0, abs=0.9)


def test_adaptive_interval_gets_measured_and_estimated_m(tiny):
    class Controller:
        def __init__(self) -> None:
            self.interval_s = 2.0
            self.calls: list[tuple] = []

        def next_interval(self, m_real, m_est):
            self.calls.append((m_real, m_est))
            self.interval_s = [3.0, 5.0, 1.0][min(len(self.calls) - 1, 2)]
            return self.interval_s

    sim = make(tiny)
    planner = Scripted()
    score = PlanScore(slo_attainment=0.9, normalized_latency=1.5, requests=10)
    orig = planner.place

    def place(gpus, services, context=None):
        planner.last_score = score if len(planner.seen) == 0 else None
        return orig(gpus, services, context)

    planner.place = place
    ctl = Controller()
    loop = PlacementLoop(planner, pool_of(sim.spec), interval_s=2.0, adaptive=ctl)
    loop.install(sim, 0.0)
    sim.run(steady(120, 0.1), strict_services=True)
    assert [d.t for d in loop.decisions[:4]] == approx([2.0, 5.0, 10.0, 11.0])
    (r1, e1), (_, e2), (_, e3) = ctl.calls[:3]
    assert e1 is None and r1 is not None and r1 > 0  # no estimate before the first plan
    assert e2 == approx(performance(0.9, 1.5)) == e3  # the planner's score, kept while it gives none
    assert loop.decisions[1].m_est == e2 and loop.decisions[0].next_interval_s == 3.0


def test_planners_that_simulate_get_an_evaluator_over_the_window(tiny):
    class Evaluating(Scripted):
        needs: ClassVar[PlacementNeeds] = PlacementNeeds(evaluator=True)

    made, closed = [], []

    class Ev:
        parallelism = 1

        def evaluate(self, plans):
            return [PlanScore(1.0, 1.0) for _ in plans]

        def close(self):
            closed.append(True)

    def factory(spec, requests, now):
        made.append((now, [r.arrival_s for r in requests]))
        return Ev()

    sim = make(tiny)
    with pytest.raises(ValueError, match="evaluator_factory"):
        PlacementLoop(Evaluating(), pool_of(sim.spec), interval_s=2.0)
    loop = PlacementLoop(
        Evaluating(), pool_of(sim.spec), interval_s=2.0, window_s=1.0, evaluator_factory=factory
    )
    loop.install(sim, 0.0)
    sim.run(steady(40, 0.1), strict_services=True)
    now, arrivals = made[0]
    assert now == 2.0 and arrivals == approx([1.1 + 0.1 * i for i in range(10)])  # (1 s, 2 s]
    assert len(closed) == len(made) >= 2
    assert isinstance(loop.planner.seen[0][2].evaluator, Ev)


def test_a_placement_loop_blocks_partitioning_and_simulate_reports_decisions(tiny):
    sim = make(tiny)
    PlacementLoop(Scripted(), pool_of(sim.spec), interval_s=1.0).install(sim, 0.0)
    assert "hooks" in partition_blocker(sim)
    spec = tiny.spec(services=(S7,), cluster="4xA100-80GB")
    bundle = PolicyBundle("dyn", {"policy": "dedicated_even", "interval_s": 2.0})
    work = Workload(tuple(steady(80, 0.1, services=("s",))))
    exp = simulate(spec, work, bundle, workers=2)
    assert exp.result.workers == 1  # hooks couple the instances: run serially
    decisions = exp.report["placement"]
    assert [d["t"] for d in decisions[:3]] == [2.0, 4.0, 6.0] and all(d["error"] == "" for d in decisions)
    assert decisions[0]["gpus_in_use"] == 4 and exp.report["cluster"]["gpu_seconds"] > 0
    assert exp.report["overall"]["completed"] == 80
    with pytest.raises(ValueError, match=r"valid: .*dedicated_even"):
        simulate(spec, work, PolicyBundle("bad", "nope"))
    with pytest.raises(ValueError, match=r"placement\.interval_s"):
        simulate(spec, work, PolicyBundle("bad", {"interval_s": 0.0}))
