"""The live engine's static mode: StaticBatches runs a static batcher as a RequestPolicy. Driven here
by the simulator's continuous path (the engine's loop, step for step)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from llmfleet.policies.batching import StaticSls, StaticSlsOptions
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
    recs = run(lambda: StaticBatches(StaticSls(StaticSlsOptions(batch_size=2))), REQS)
    assert all(r.done for r in recs.values())
    # a and b form the first batch; c and d arrive while it runs and start only after it ends (a's end)
    assert recs["c"].first_token_s > recs["a"].finish_s
    assert recs["d"].first_token_s > recs["a"].finish_s
    # with continuous batching c joins at once
    fcfs = run(Fcfs, REQS)
    assert fcfs["c"].first_token_s < fcfs["a"].finish_s


def test_slice_end_parks_and_rebatches_without_recompute():
    recs = run(lambda: StaticBatches(StaticSls(StaticSlsOptions(batch_size=4, max_iterations=8))), REQS)
    assert all(r.done for r in recs.values())
    assert all(r.preemptions == 0 for r in recs.values())  # parked requests keep their KV


def test_engine_policy_registry_covers_both_kinds():
    assert {"fcfs", "doubling_budget", "static_sls", "scls", "slo_odbs", "s3"} <= set(ENGINE_POLICIES)
    assert isinstance(make_engine_policy("static_sls"), StaticBatches)
    assert isinstance(make_engine_policy("fcfs"), RequestPolicy)
    with pytest.raises(ValueError, match=r"unknown engine policy 'nope'.*fcfs"):
        make_engine_policy("nope")


def test_recompute_mode_is_the_batcher_itself_for_the_core_static_mode():
    """``slice_end="recompute"`` hands the batcher to the engine core's static mode (padded, recompute);
    the old ``keep_kv`` is refused, naming ``slice_end``."""
    from llmfleet.engine_core import EngineCore
    from llmfleet.kvblocks import BlockAllocator, KvShape

    p = make_engine_policy("static_sls", batch_size=2, slice_end="recompute")
    with pytest.raises(ValueError, match=r"keep_kv was renamed: write slice_end: keep\|recompute"):
        make_engine_policy("static_sls", batch_size=2, keep_kv=False)
    assert isinstance(p, StaticSls)
    alloc = BlockAllocator(64, 1024, watermark=0.0)
    alloc.register_model("m", KvShape(num_layers=1, num_kv_heads=1, head_dim=8))
    assert EngineCore(p, alloc).static and not EngineCore(make_engine_policy("static_sls"), alloc).static
