"""The live engine's static mode: StaticBatches runs a static batcher as a RequestPolicy. Driven here
by the simulator's continuous path (the engine's loop, step for step)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from llmfleet.policies.batching import StaticSls
from llmfleet.policies.dispatch import RoundRobin
from llmfleet.policies.engine_policy import ENGINE_POLICIES, make_engine_policy
from llmfleet.policies.placement import InstancePlan
from llmfleet.policies.request import Fcfs, RequestPolicy
from llmfleet.policies.request.static_batches import StaticBatches
from llmfleet.sim.cost import CostBook
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec


@dataclass
class W:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    service: str = "s"


def run(policy_factory, reqs, **eng):
    spec = SimSpec(ClusterSpec.parse("1xA100-80GB"), (SimService("s", "llama2-7b"),), EngineSettings(**eng))
    sim = Simulator(spec, [InstancePlan("i0", ("llama2-7b",), 1)], policy_factory, RoundRobin(),
                    CostBook.build(spec.cluster.hw, spec.archs()), fast_forward=False)  # fmt: skip
    return {r.request_id: r for r in sim.run(reqs).records}


REQS = [W("a", 0.0, 50, 40), W("b", 0.0, 60, 10), W("c", 0.05, 30, 5), W("d", 0.06, 30, 5)]


def test_no_request_joins_a_running_static_batch():
    recs = run(lambda: StaticBatches(StaticSls(batch_size=2)), REQS)
    assert all(r.done for r in recs.values())
    # a and b form the first batch; c and d arrive while it runs and start only after it ends (a's end)
    assert recs["c"].first_token_s > recs["a"].finish_s
    assert recs["d"].first_token_s > recs["a"].finish_s
    # with continuous batching c joins at once
    fcfs = run(Fcfs, REQS)
    assert fcfs["c"].first_token_s < fcfs["a"].finish_s


def test_slice_end_parks_and_rebatches_without_recompute():
    recs = run(lambda: StaticBatches(StaticSls(batch_size=4, max_iterations=8)), REQS)
    assert all(r.done for r in recs.values())
    assert all(r.preemptions == 0 for r in recs.values())  # parked requests keep their KV


def test_engine_policy_registry_covers_both_kinds():
    assert {"fcfs", "doubling_budget", "static_sls", "scls", "slo_odbs", "s3"} <= set(ENGINE_POLICIES)
    assert isinstance(make_engine_policy("static_sls"), StaticBatches)
    assert isinstance(make_engine_policy("fcfs"), RequestPolicy)
    with pytest.raises(ValueError, match=r"unknown engine policy 'nope'.*fcfs"):
        make_engine_policy("nope")


def test_recompute_mode_releases_the_unfinished_at_a_slice_end():
    from llmfleet.policies.request import BatchLimits, PoolView, SchedRequest

    p = StaticBatches(StaticSls(batch_size=2, max_iterations=2), keep_kv=False)
    reqs = [SchedRequest("a", "s", "m", 0.0, 10, 50), SchedRequest("b", "s", "m", 0.0, 10, 50)]
    pool = PoolView(1000, 0, {"m": 16})
    for r in reqs:
        p.on_arrival(r, 0.0)
    b = p.next_batch(reqs, [], pool, BatchLimits(), 0.0)
    assert set(b.request_ids) == {"a", "b"} and b.phase == "prefill"
    for r in reqs:
        r.phase, r.generated = "decode", 1
    p.on_iteration(b, 0.1, 0.1, reqs)
    assert p.take_released() == []
    b2 = p.next_batch([], reqs, pool, BatchLimits(), 0.1)
    p.on_iteration(b2, 0.1, 0.2, reqs)  # second iteration: the slice ends
    assert p.take_released() == ["a", "b"] and p.take_released() == []
    keep = StaticBatches(StaticSls(batch_size=2, max_iterations=1))
    b = keep.next_batch(reqs[:1], [], pool, BatchLimits(), 0.0)
    keep.on_iteration(b, 0.1, 0.1, reqs[:1])
    assert keep.take_released() == []  # keep-KV mode parks instead
