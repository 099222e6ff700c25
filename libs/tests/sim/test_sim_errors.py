"""Bad input: requests that can never fit, unknown services, oversized plans, unsorted arrivals."""

from __future__ import annotations

import pytest
from llmfleet.policies.batching import StaticSls, StaticSlsOptions
from llmfleet.policies.dispatch import RoundRobin
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import Fcfs
from llmfleet.sim.memory import DoesNotFit
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import EngineSettings, SimService
from llmfleet.workload import WorkloadRequest as W

BLOCK = 16 * 524_288


def records(res):
    return {r.request_id: r for r in res.records}


@pytest.mark.parametrize("fast_forward", [True, False])
def test_unfit_request_fails_and_the_rest_complete(tiny, fast_forward):
    """A 10-block pool (160 tokens): a 1000-token prompt can never be admitted."""
    sim = tiny.sim(engine=EngineSettings(kv_bytes=10 * BLOCK, watermark=0.0), fast_forward=fast_forward)
    res = sim.run([W("a", 0.0, 20, 5, "s"), W("big", 1.0, 1000, 5, "s"), W("c", 2.0, 20, 5, "s")])
    r = records(res)
    assert not r["big"].done and "KV blocks" in r["big"].failed
    assert "63" in r["big"].failed and "10 usable" in r["big"].failed  # ceil(1001 / 16) = 63 needed
    assert r["a"].done and r["c"].done and not r["a"].failed and not r["c"].failed
    assert sim.instances["i0"].alloc.used_blocks == 0


def test_unfit_request_in_static_mode(tiny):
    sim = tiny.sim(
        engine=EngineSettings(kv_bytes=10 * BLOCK, watermark=0.0),
        make_policy=lambda: StaticSls(StaticSlsOptions(batch_size=2)),
    )
    res = sim.run([W("a", 0.0, 20, 5, "s"), W("big", 0.01, 1000, 5, "s"), W("c", 0.02, 20, 5, "s")])
    r = records(res)
    assert "KV blocks" in r["big"].failed and r["a"].done and r["c"].done


def test_request_behind_an_unfit_head_still_runs(tiny):
    """a runs; big (unfit) and c wait behind it; when a finishes the instance must fail big and run c."""
    sim = tiny.sim(engine=EngineSettings(kv_bytes=10 * BLOCK, watermark=0.0))
    res = sim.run([W("a", 0.0, 100, 50, "s"), W("big", 0.01, 1000, 5, "s"), W("c", 0.02, 10, 5, "s")])
    r = records(res)
    assert "KV blocks" in r["big"].failed
    assert r["c"].done, r["c"].failed


def test_unknown_service_with_several_services(tiny):
    svcs = [SimService("chat", "llama2-7b"), SimService("code", "llama2-7b")]
    sim = tiny.sim(services=svcs)
    with pytest.raises(KeyError) as e:
        sim.run([W("a", 0.0, 10, 2, "chat"), W("b", 0.1, 10, 2, "nope")])
    assert "nope" in str(e.value) and "chat" in str(e.value) and "code" in str(e.value)


def test_one_service_takes_any_label_unless_strict(tiny):
    res = tiny.sim().run([W("a", 0.0, 10, 2, "whatever")])
    assert res.records[0].service == "s" and res.records[0].done
    with pytest.raises(KeyError, match="whatever"):
        tiny.sim().run([W("a", 0.0, 10, 2, "whatever")], strict_services=True)


def test_plan_larger_than_the_cluster(tiny):
    with pytest.raises(ValueError, match="uses 4 GPUs but the cluster has 2"):
        tiny.sim(plan=[InstancePlan("i0", ("llama2-7b",), 2), InstancePlan("i1", ("llama2-7b",), 2)])


def test_empty_plan_and_unused_model(tiny):
    spec = tiny.spec()
    book = tiny.book(spec)
    with pytest.raises(ValueError, match="no instances"):
        Simulator(spec, [], Fcfs, RoundRobin(), book)
    with pytest.raises(ValueError, match="llama3-8b"):
        Simulator(spec, [InstancePlan("i0", ("llama3-8b",), 1)], Fcfs, RoundRobin(), book)


def test_model_that_does_not_fit_the_gpu(tiny):
    with pytest.raises(DoesNotFit, match="larger TP degree"):
        tiny.sim(services=[SimService("big", "llama2-70b")], plan=[InstancePlan("i0", ("llama2-70b",), 1)])


def test_empty_workload(tiny):
    with pytest.raises(ValueError, match="no requests"):
        tiny.sim().run([])


def test_unsorted_arrivals_raise_value_error(tiny):
    with pytest.raises(ValueError, match="sorted by arrival"):
        tiny.sim().run([W("a", 1.0, 10, 2, "s"), W("b", 0.5, 10, 2, "s")])


def test_unsorted_arrivals_are_rejected(tiny):
    """Whatever the exception type, an unsorted workload must not be simulated silently."""
    with pytest.raises((ValueError, RuntimeError)):
        tiny.sim().run([W("a", 1.0, 10, 2, "s"), W("b", 0.5, 10, 2, "s")])
