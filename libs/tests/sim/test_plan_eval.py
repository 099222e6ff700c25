"""The plan evaluator simulates a plan component by component: every record equals the whole plan's run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from llmfleet.policies.dispatch import make_dispatch_policy
from llmfleet.policies.placement import InstancePlan
from llmfleet.sim.cost import CostBook
from llmfleet.sim.plan_eval import SimPlanEvaluator, components
from llmfleet.sim.run import preset
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.workload import WorkloadRequest

SPEC = SimSpec(
    ClusterSpec.parse("8xA100-80GB"),
    (SimService("A", "llama2-7b"), SimService("B", "llama2-13b"), SimService("C", "opt-6.7b")),
)
P7, P13, POPT = "llama2-7b", "llama2-13b", "opt-6.7b"


def _requests() -> list[WorkloadRequest]:
    rng = np.random.default_rng(3)
    reqs = [
        WorkloadRequest(
            f"{s}{i}", float(t), int(rng.integers(20, 900)), int(rng.integers(10, 300)), service=s
        )
        for s, rate in (("A", 6.0), ("B", 3.0), ("C", 2.0))
        for i, t in enumerate(np.cumsum(rng.exponential(1 / rate, int(rate * 30))))
    ]
    return sorted(reqs, key=lambda r: (r.arrival_s, r.request_id))


def _whole(bundle, plan, reqs):
    """The plan simulated in one run, as the evaluator did before it split plans."""
    cost = CostBook.build(SPEC.cluster.hw, SPEC.archs(), (), SPEC.cost_source)
    dispatch = make_dispatch_policy(bundle.dispatch.policy, **bundle.dispatch.options)
    sim = Simulator(SPEC, plan, bundle.local_factory(), dispatch, cost)
    return sim.run(reqs, strict_services=True).records


def _outcome(r):
    d = dataclasses.asdict(r)
    d["failed"] = bool(d["failed"])  # the reason's words differ for a model no instance hosts
    return d


PLANS = [
    [InstancePlan("g0", (P7,), 1), InstancePlan("g1", (P13,), 2), InstancePlan("g2", (P7,), 1)],
    [InstancePlan("g0", (P7,), 1), InstancePlan("g1", (P13,), 2), InstancePlan("g2", (P7, POPT), 2)],
    [InstancePlan("g0", (P13, P7), 2), InstancePlan("g1", (P13,), 2), InstancePlan("g2", (POPT,), 1)],
    [InstancePlan("g0", (P7,), 1), InstancePlan("g1", (P13,), 2), InstancePlan("g3", (POPT,), 1)],
]


def test_components_link_instances_that_share_a_model():
    assert [[p.instance_id for p in c] for c in components(PLANS[0])] == [["g0", "g2"], ["g1"]]
    assert [[p.instance_id for p in c] for c in components(PLANS[1])] == [["g0", "g2"], ["g1"]]
    assert [[p.instance_id for p in c] for c in components(PLANS[2])] == [["g0", "g1"], ["g2"]]
    chain = [InstancePlan("a", (P7,), 1), InstancePlan("b", (P13,), 1), InstancePlan("c", (P13, P7), 2)]
    assert [[p.instance_id for p in c] for c in components(chain)] == [["a", "b", "c"]]


@pytest.mark.parametrize("bundle", ["seallm", "vllm-v0.4", "vllm"])  # jsq + doubling budget, jsq, round robin
def test_records_by_component_equal_the_whole_plans_run(bundle):
    """Plans in a row share components (g1 alone, then the 7B pair again): the kept records of a
    component give the same records as a fresh run of the whole plan, services no plan hosts included."""
    reqs = _requests()
    b = preset(bundle)
    with SimPlanEvaluator(SPEC, reqs, b) as ev:
        for plan in PLANS:
            got = ev.records(plan)
            want = _whole(b, plan, reqs)
            assert [_outcome(r) for r in got] == [_outcome(r) for r in want]
        assert any(r.failed for r in ev.records(PLANS[0]))  # OPT is hosted nowhere in the first plan
        scores = ev.evaluate(PLANS)
    with SimPlanEvaluator(SPEC, reqs, b) as fresh:
        assert [fresh.evaluate([p])[0] for p in reversed(PLANS)] == scores[::-1]


def test_a_plan_hosting_a_model_no_service_uses_is_refused():
    with SimPlanEvaluator(SPEC, _requests(), preset("seallm")) as ev, pytest.raises(ValueError, match="70b"):
        ev.evaluate([[InstancePlan("g0", (P7,), 1), InstancePlan("g1", ("llama2-70b",), 4)]])
