"""SeaLLM Algorithm 1 (placement search) and Eq. 8 (adaptive replacement interval)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from llmfleet.policies.placement import (
    AdaptiveInterval,
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementInfeasible,
    PlanScore,
    SeaLLMOptions,
    SeaLLMPlacement,
    ServiceLoad,
    make_placement_policy,
    performance,
)
from llmfleet.policies.placement.adaptive_interval import deviation

MODEL = {"A": "llama2-7b", "B": "llama2-13b", "X": "llama2-70b"}


class HandEvaluator:
    """A plan's score computable by hand: service s has ``reqs[s]`` requests and needs ``need[s]``
    replicas; each missing replica leaves reqs/need of them violated. L_N^s = reqs (+10·reqs when the
    service has no replica). The normalized latency is 2.0 for plans of tp-1 groups, 1.5 otherwise."""

    def __init__(self, reqs: dict[str, int], need: dict[str, int], parallelism: int = 1) -> None:
        self.reqs, self.need = reqs, need
        self.parallelism = parallelism
        self.calls: list[list[InstancePlan]] = []
        self.batches: list[int] = []

    def close(self) -> None:
        pass

    def evaluate(self, plans: Sequence[Sequence[InstancePlan]]) -> list[PlanScore]:
        out = []
        self.batches.append(len(plans))
        for plan in plans:
            self.calls.append(list(plan))
            rep = {s: sum(1 for p in plan if MODEL[s] in p.models) for s in self.reqs}
            viol = {s: self.reqs[s] * max(0, self.need[s] - rep[s]) // self.need[s] for s in self.reqs}
            lat = {s: self.reqs[s] * (11.0 if rep[s] == 0 else 1.0) for s in self.reqs}
            total = sum(self.reqs.values())
            nl = 2.0 if plan and all(p.tp == 1 for p in plan) else 1.5
            out.append(PlanScore(1 - sum(viol.values()) / total, nl, viol, lat, total))
        return out


def loads(**rates: float) -> list[ServiceLoad]:
    return [ServiceLoad(s, MODEL[s], r, 200, 200) for s, r in rates.items()]


def test_algorithm1_by_hand_two_candidates():
    """4 A100s; A (7B, 3 req/s, needs 2 replicas), B (13B, 1 req/s, needs 1); candidates tp 1 and 2.

    tp=1, 4 groups at rate 0: UI_A = 30 > UI_B = 10 → A to tp1-0; B is hosted nowhere, so it goes
    before A (UI 15; Eq. 3) → B to the lowest-rate group tp1-1; A still misses 15 → A to tp1-2 (rate 0);
    UIs are α·L_N only (A 0.003 > B 0.001) → A to tp1-3 (rate 0); rates A 3/3 = 1, B 1 → all 1, by id:
    tp1-0 takes B (A is there); now B's 2 replicas give 0.5 each: tp1-1 {B} is lowest → takes A; A's 4
    replicas give 0.75: tp1-2 {A} (0.75, before tp1-3 by id) takes B; tp1-3 {A} (0.75) takes B; all
    groups hold 2 services → stop.
    tp=2, 2 groups: A → tp2-0, B (hosted nowhere) → tp2-1, A → tp2-1 (rate 1 < 3), B → tp2-0.
    Both reach attainment 1; tp=2 has the lower normalized latency (1.5 < 2.0) and wins."""
    ev = HandEvaluator({"A": 30, "B": 10}, {"A": 2, "B": 1})
    p = SeaLLMPlacement(SeaLLMOptions(tp_candidates=(1, 2)))
    plan = p.place(GpuPool("a100-80gb", 4, 4), loads(A=3.0, B=1.0), PlacementContext(evaluator=ev))
    assert p.search_log[1] == [
        ("tp1-0", "A"), ("tp1-1", "B"), ("tp1-2", "A"), ("tp1-3", "A"),
        ("tp1-0", "B"), ("tp1-1", "A"), ("tp1-2", "B"), ("tp1-3", "B"),
    ]  # fmt: skip
    assert p.search_log[2] == [("tp2-0", "A"), ("tp2-1", "B"), ("tp2-1", "A"), ("tp2-0", "B")]
    assert plan == [
        InstancePlan("tp2-0", ("llama2-13b", "llama2-7b"), 2),
        InstancePlan("tp2-1", ("llama2-13b", "llama2-7b"), 2),
    ]
    assert p.last_score is not None and p.last_score.normalized_latency == 1.5
    # lockstep: 9 rounds for tp=1 (8 additions + the final check), 5 for tp=2 → 14 plans, of which
    # the empty plan both candidates start from is simulated once
    assert p.evaluations == len(ev.calls) == 13
    assert ev.calls[0] == [] and [] not in ev.calls[1:]


@pytest.mark.parametrize("parallelism", [2, 3, 8])
def test_speculation_fills_idle_slots_and_changes_nothing(parallelism):
    """Idle worker slots score the plans the next steps would make under the last UI ordering; the
    search's steps, plan and score are those of the plain search, in fewer evaluate() rounds."""
    args = (GpuPool("a100-80gb", 8, 4), loads(A=3.0, B=1.0))
    plain_ev = HandEvaluator({"A": 30, "B": 10}, {"A": 3, "B": 1})
    plain = SeaLLMPlacement(SeaLLMOptions(tp_candidates=(1, 2)))
    want = plain.place(*args, PlacementContext(evaluator=plain_ev))
    ev = HandEvaluator({"A": 30, "B": 10}, {"A": 3, "B": 1}, parallelism=parallelism)
    p = SeaLLMPlacement(SeaLLMOptions(tp_candidates=(1, 2)))
    assert p.place(*args, PlacementContext(evaluator=ev)) == want
    assert p.search_log == plain.search_log and p.last_score == plain.last_score
    assert plain.speculated == plain.speculation_hits == 0
    assert 0 < p.speculation_hits <= p.speculated and p.evaluations == len(ev.calls)
    assert len(ev.calls) == len({tuple(c) for c in ev.calls})  # no plan simulated twice
    assert len(ev.batches) < len(plain_ev.batches)  # fewer rounds on the critical path
    assert all(n <= max(parallelism, 2) for n in ev.batches)  # never more than fills the workers


def test_cap_of_services_per_group_and_unserved_first():
    ev = HandEvaluator({"A": 30, "B": 10}, {"A": 1, "B": 1})
    p = SeaLLMPlacement(SeaLLMOptions(max_services=1, tp_candidates=(2,)))
    plan = p.place(GpuPool("a100-80gb", 4, 4), loads(A=3.0, B=1.0), PlacementContext(evaluator=ev))
    assert p.search_log[2] == [("tp2-0", "A"), ("tp2-1", "B")]  # one service per group
    assert [x.models for x in plan] == [("llama2-7b",), ("llama2-13b",)]


def test_a_model_too_big_for_a_group_merges_two_empty_groups():
    ev = HandEvaluator({"X": 10}, {"X": 1})
    p = SeaLLMPlacement(SeaLLMOptions(tp_candidates=(1,)))
    plan = p.place(GpuPool("a100-80gb", 4, 4), loads(X=1.0), PlacementContext(evaluator=ev))
    # 70B (≈129 GiB) needs two 80 GiB GPUs: tp1-0 absorbs tp1-1, then tp1-2 absorbs tp1-3
    assert [(x.instance_id, x.tp) for x in plan] == [("tp1-0+1", 2), ("tp1-2+3", 2)]


def test_new_service_gets_minimal_dedicated_gpus_without_a_search():
    ev = HandEvaluator({"A": 10, "B": 10}, {"A": 1, "B": 1})
    p = SeaLLMPlacement()
    current = (InstancePlan("tp1-0", ("llama2-7b",), 1),)
    plan = p.place(GpuPool("a100-80gb", 4, 4), loads(A=1.0, B=1.0), PlacementContext(current, ev))
    assert plan == [*current, InstancePlan("new-llama2-13b", ("llama2-13b",), 1)]
    assert ev.calls == [] and p.last_score is None and "new services" in p.last_reason


def test_cold_start_places_every_service_on_minimal_dedicated_gpus_without_an_evaluator():
    # a live leader that has seen no request yet: no evaluator, nothing placed
    p = SeaLLMPlacement()
    plan = p.place(GpuPool("a100-80gb", 4, 4), loads(A=0.0, B=0.0))
    assert plan == [
        InstancePlan("new-llama2-13b", ("llama2-13b",), 1),
        InstancePlan("new-llama2-7b", ("llama2-7b",), 1),
    ]
    assert "no recent workload" in p.last_reason
    # every service hosted and still no evaluator: nothing to search on; the plan in force stays
    with pytest.raises(ValueError, match="recent requests"):
        p.place(GpuPool("a100-80gb", 4, 4), loads(A=1.0, B=1.0), PlacementContext(tuple(plan)))
    # a pool that cannot hold the newcomers: no search possible either
    with pytest.raises(ValueError, match="recent requests"):
        p.place(GpuPool("a100-80gb", 1, 1), loads(A=0.0, B=0.0))


def test_bad_input():
    ev = HandEvaluator({"X": 1}, {"X": 1})
    with pytest.raises(PlacementInfeasible, match="llama2-70b"):
        SeaLLMPlacement().place(GpuPool("l4", 2, 2), loads(X=1.0), PlacementContext(evaluator=ev))
    with pytest.raises(ValueError, match="powers of two"):
        SeaLLMPlacement(SeaLLMOptions(tp_candidates=(3,)))
    assert isinstance(make_placement_policy("seallm", max_services=3), SeaLLMPlacement)
    assert SeaLLMPlacement.needs.evaluator


def test_simulated_evaluator_end_to_end_and_parallel_equals_serial():
    import numpy as np
    import psutil
    from llmfleet.sim.plan_eval import PlanWorkers, SimPlanEvaluator
    from llmfleet.sim.run import preset
    from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
    from llmfleet.workload import WorkloadRequest

    rng = np.random.default_rng(1)
    spec = SimSpec(
        ClusterSpec.parse("4xA100-80GB"), (SimService("A", "llama2-7b"), SimService("B", "llama2-13b"))
    )
    reqs = sorted(
        (
            WorkloadRequest(
                f"{s}{i}", float(t), int(rng.integers(20, 200)), int(rng.integers(10, 100)), service=s
            )
            for s, rate in (("A", 4.0), ("B", 1.0))
            for i, t in enumerate(np.cumsum(rng.exponential(1 / rate, int(rate * 20))))
        ),
        key=lambda r: (r.arrival_s, r.request_id),
    )
    plans = [
        [],
        [InstancePlan("g0", ("llama2-7b",), 2)],
        [InstancePlan("g0", ("llama2-13b", "llama2-7b"), 4)],
    ]
    with SimPlanEvaluator(spec, reqs, preset("seallm")) as serial:
        s = serial.evaluate(plans)
    half = reqs[: len(reqs) // 2]
    with SimPlanEvaluator(spec, half, preset("seallm")) as serial:
        s_half = serial.evaluate(plans)
    assert s_half != s
    # one pool of workers for evaluator after evaluator on other workloads (a placement loop's ticks)
    with PlanWorkers(2) as workers:
        for workload, want in ((reqs, s), (half, s_half), (reqs, s)):
            with SimPlanEvaluator(spec, workload, preset("seallm"), workers=workers) as par:
                assert par.parallelism == 2 and par.evaluate(plans) == want
        for child in psutil.Process().children():  # a worker dies (killed, out of memory): new ones score
            if "resource_tracker" not in " ".join(child.cmdline()):
                child.kill()
        with SimPlanEvaluator(spec, half, preset("seallm"), workers=workers) as par:
            assert par.evaluate(plans) == s_half
    nb = sum(1 for r in reqs if r.service == "B")
    assert s[0].slo_attainment == 0 and s[0].violations == {"A": len(reqs) - nb, "B": nb}
    assert s[1].violations["B"] == nb and s[1].violations["A"] < len(reqs) - nb
    assert s[2].slo_attainment > s[1].slo_attainment
    plan = SeaLLMPlacement(SeaLLMOptions(tp_candidates=(2, 4))).place(
        GpuPool("a100-80gb", 4, 4),
        loads(A=4.0, B=1.0),
        PlacementContext(evaluator=SimPlanEvaluator(spec, reqs, preset("seallm"))),
    )
    assert {m for x in plan for m in x.models} == {"llama2-7b", "llama2-13b"}


def test_adaptive_interval_eq8():
    a = AdaptiveInterval(initial_s=100, beta=0.1, min_s=50, max_s=130)
    assert a.next_interval(0.95, 1.0) == pytest.approx(110)  # |Δ|/M = 0.05 ≤ β → (1+β)
    assert a.next_interval(0.5, 1.0) == pytest.approx(99)  # 0.5 > β → (1−β)
    assert a.next_interval(None, 1.0) == pytest.approx(99)  # no measurement: unchanged
    for _ in range(10):
        a.next_interval(1.0, 1.0)
    assert a.interval_s == 130  # clamped
    for _ in range(20):
        a.next_interval(0.0, 1.0)
    assert a.interval_s == 50
    assert deviation(0, 0) == 0 and math.isinf(deviation(1, 0))
    assert performance(0.9, 1.8) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        performance(1.2, 1.0)
    with pytest.raises(ValueError):
        AdaptiveInterval(beta=1.0)


def test_sharing_cap_as_a_search_dimension():
    """With caps (1, 2) each TP size is searched twice; the hand scores tie on attainment and latency,
    so the smaller cap wins the tie (fewer models per group)."""
    ev = HandEvaluator({"A": 30, "B": 10}, {"A": 1, "B": 1})
    p = SeaLLMPlacement(SeaLLMOptions(max_services=(1, 2), tp_candidates=(2,)))
    plan = p.place(GpuPool("a100-80gb", 4, 4), loads(A=3.0, B=1.0), PlacementContext(evaluator=ev))
    assert set(p.search_log) == {(2, 1), (2, 2)}
    assert p.search_log[(2, 1)] == [("tp2-0", "A"), ("tp2-1", "B")]
    assert [x.models for x in plan] == [("llama2-7b",), ("llama2-13b",)]
    assert "≤ 1 services per group" in p.last_reason
    with pytest.raises(ValueError, match="max_services"):
        SeaLLMPlacement(SeaLLMOptions(max_services=(0, 2)))


def test_the_simulator_can_start_as_a_live_leader_does():
    """``first_plan="cold"``: the plan in force at t=0 is what a live leader with no request seen yet
    places (minimal dedicated GPUs per model); ``"oracle"`` searches on the workload's first window."""
    from llmfleet.sim.plan_eval import SimPlanEvaluator
    from llmfleet.sim.run import preset, simulate
    from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
    from llmfleet.workload import Workload, WorkloadRequest

    spec = SimSpec(
        ClusterSpec.parse("4xA100-80GB"), (SimService("A", "llama2-7b"), SimService("B", "llama2-13b"))
    )
    reqs = Workload(
        tuple(WorkloadRequest(f"r{i}", i * 0.25, 100, 20, service="AB"[i % 2]) for i in range(40))
    )
    cold = simulate(spec, reqs, preset("seallm", placement="seallm", first_plan="cold"))
    assert sorted((p.models, p.tp) for p in cold.plan) == [(("llama2-13b",), 1), (("llama2-7b",), 1)]
    assert all(r.done for r in cold.result.records)

    def factory(s, rs, now):
        return SimPlanEvaluator(s, rs, preset("seallm"))

    oracle = simulate(spec, reqs, preset("seallm", placement="seallm"), evaluator_factory=factory)
    assert oracle.plan != cold.plan
    with pytest.raises(ValueError, match="first_plan"):
        preset("seallm", first_plan="later")


def _svc(name: str, rate: float, prompt: float, output: float, std: float = 0.0) -> ServiceLoad:
    return ServiceLoad(name, MODEL[name], rate, prompt, output, std, 0.0)


def test_a_service_is_not_placed_where_its_longest_request_does_not_fit_the_kv_pool():
    """CanAllocate checks the KV pool, not only the weights: 70B + 7B on two A100-80GB leave ~1 GB of
    KV (3,105 tokens of the 70B, less than its 4,096-token context), so a 70B service must not share its
    TP-2 group with the 7B, however high the 7B's unserved index and however short the 70B's requests
    (a preempted request at the model's longest context could never be prefilled again; vLLM refuses
    such an engine)."""
    for prompt in (3800, 500):
        ev = HandEvaluator({"A": 30, "X": 10}, {"A": 3, "X": 1})
        plan = SeaLLMPlacement(SeaLLMOptions(tp_candidates=(1,))).place(
            GpuPool("a100-80gb", 4, 4), [_svc("A", 3.0, 1100, 400), _svc("X", 1.0, prompt, 20)],
            PlacementContext(evaluator=ev),
        )  # fmt: skip
        hosts_x = [x for x in plan if "llama2-70b" in x.models]
        assert hosts_x and all(x.models == ("llama2-70b",) for x in hosts_x)
        assert any("llama2-7b" in x.models for x in plan)
    # the 7B and the 13B keep room for each other's longest requests on one GPU: they share
    ev = HandEvaluator({"A": 30, "B": 10}, {"A": 3, "B": 1})
    plan = SeaLLMPlacement(SeaLLMOptions(tp_candidates=(1,))).place(
        GpuPool("a100-80gb", 1, 1), [_svc("A", 3.0, 200, 100), _svc("B", 1.0, 500, 20)],
        PlacementContext(evaluator=ev),
    )  # fmt: skip
    assert any(set(x.models) == {"llama2-13b", "llama2-7b"} for x in plan)


def test_every_service_with_traffic_gets_an_instance():
    """Eq. 3 (every service placed): B's 5 requests never top A's unserved index, yet B must get one
    of the two groups; a service without traffic is not pushed ahead."""
    ev = HandEvaluator({"A": 100, "B": 5}, {"A": 8, "B": 1})
    p = SeaLLMPlacement(SeaLLMOptions(max_services=1, tp_candidates=(1,)))
    plan = p.place(
        GpuPool("a100-80gb", 2, 2), [_svc("A", 9.0, 200, 100), _svc("B", 0.5, 200, 100)],
        PlacementContext(evaluator=ev),
    )  # fmt: skip
    assert sorted(m for x in plan for m in x.models) == ["llama2-13b", "llama2-7b"]
    ev = HandEvaluator({"A": 100, "B": 0}, {"A": 8, "B": 1})
    plan = SeaLLMPlacement(SeaLLMOptions(max_services=1, tp_candidates=(1,))).place(
        GpuPool("a100-80gb", 2, 2), [_svc("A", 9.0, 200, 100), _svc("B", 0.0, 0, 0)],
        PlacementContext(evaluator=ev),
    )  # fmt: skip
    assert [x.models for x in plan] == [("llama2-7b",), ("llama2-7b",)]


class _FavourTp4:
    """Scores any plan of TP-4 groups 0.99, others 0.5: only the rule that a plan must host every
    service with traffic keeps the TP-4 candidate (which cannot host both) from winning."""

    parallelism = 1

    def close(self) -> None:
        pass

    def evaluate(self, plans: Sequence[Sequence[InstancePlan]]) -> list[PlanScore]:
        return [
            PlanScore(0.99 if p and all(x.tp == 4 for x in p) else 0.5, 1.0, {"A": 1, "X": 1}, {}, 2)
            for p in plans
        ]


def test_a_candidate_that_leaves_a_service_unhosted_loses():
    p = SeaLLMPlacement(SeaLLMOptions(max_services=1, tp_candidates=(1, 4)))
    plan = p.place(
        GpuPool("a100-80gb", 4, 4), [_svc("A", 3.0, 200, 100), _svc("X", 1.0, 200, 20)],
        PlacementContext(evaluator=_FavourTp4()),
    )  # fmt: skip
    assert {m for x in plan for m in x.models} == {"llama2-7b", "llama2-70b"}
    assert all(x.tp < 4 for x in plan)


def test_simulated_search_on_long_70b_prompts_fails_no_request():
    """End to end on the simulator: the 70B's 3,800-token prompts fail on a 70B + 7B TP-2 pool; the
    searched plan serves every request of both services."""
    from llmfleet.sim.plan_eval import SimPlanEvaluator
    from llmfleet.sim.run import preset, service_loads
    from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
    from llmfleet.workload import Workload, WorkloadRequest

    spec = SimSpec(
        ClusterSpec.parse("4xA100-80GB"), (SimService("A", "llama2-7b"), SimService("X", "llama2-70b"))
    )
    reqs = [WorkloadRequest(f"a{i}", i * 0.1, 1100, 50, service="A") for i in range(60)]
    reqs += [WorkloadRequest(f"x{i}", 0.05 + i * 1.0, 3800, 5, service="X") for i in range(6)]
    wl = Workload(tuple(sorted(reqs, key=lambda r: (r.arrival_s, r.request_id))))
    with SimPlanEvaluator(spec, wl.requests, preset("seallm")) as ev:
        shared = [InstancePlan("g0", ("llama2-70b", "llama2-7b"), 2), InstancePlan("g1", ("llama2-7b",), 2)]
        assert ev.evaluate([shared])[0].violations["X"] == 6  # what a plan sharing the 70B scores
        p = SeaLLMPlacement(SeaLLMOptions(tp_candidates=(1,)))
        plan = p.place(GpuPool("a100-80gb", 4, 4), service_loads(wl, spec), PlacementContext(evaluator=ev))
    assert all(x.models == ("llama2-70b",) for x in plan if "llama2-70b" in x.models)
    assert p.last_score is not None and p.last_score.violations["X"] < 6
