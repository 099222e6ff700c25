"""A run that stops at the first completed request a predicate picks: the same simulation up to that
point, no failures invented for the requests still under way, and the report says when it stopped."""

from __future__ import annotations

import math

import pytest
from llmfleet.costmodel import RooflineModel, hardware, model_arch
from llmfleet.policies.placement import InstancePlan
from llmfleet.sim.metrics import aladdin_ratio
from llmfleet.sim.run import PolicyBundle, simulate
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.types import Slo
from llmfleet.workload import Workload, WorkloadRequest

SLO = Slo(ttft_s=0.4, tpot_s=0.015)
SPEC = SimSpec(ClusterSpec.parse("2xA100-80GB"), (SimService("chat", "llama2-7b", SLO),))
PLAN = [InstancePlan(f"w{i}", ("llama2-7b",), 1) for i in range(2)]
# a burst the two workers cannot serve within the SLO: queueing makes later requests miss TTFT
WL = Workload(
    tuple(WorkloadRequest(f"r{i}", 0.04 * i, 900 + 37 * (i % 5), 40 + 9 * (i % 7), "chat", "llama2-7b")
          for i in range(300))
)  # fmt: skip


def missed(r) -> bool:
    return aladdin_ratio(r, SLO) > 1.0


ALADDIN = {  # a dispatcher that hears of every completion (on_finish) still does with a stop
    "policy": "aladdin_bestfit",
    "options": {
        "latency_models": {"llama2-7b": RooflineModel(model_arch("llama2-7b"), hardware("a100-80gb"))},
        "slos": {"llama2-7b": (SLO.ttft_s, SLO.tpot_s)},
    },
}


@pytest.mark.parametrize("dispatch", ["jsq", ALADDIN], ids=["jsq", "aladdin"])
def test_the_run_stops_at_the_first_miss_and_is_the_full_run_until_then(dispatch):
    bundle = PolicyBundle("p", dispatch=dispatch, engine="fcfs")
    full = simulate(SPEC, WL, bundle, plan=PLAN)
    first_miss = min(r.finish_s for r in full.result.records if r.done and missed(r))
    assert not full.report["overall"]["aladdin_at"]["p100"]["met"] and full.result.stopped_s is None

    cut = simulate(SPEC, WL, bundle, plan=PLAN, stop=missed)
    assert cut.result.stopped_s == pytest.approx(first_miss)
    assert cut.report["stopped_s"] == cut.result.stopped_s and "stopped_s" not in full.report
    assert cut.result.end_s == pytest.approx(first_miss)
    by_id = {r.request_id: r for r in full.result.records}
    done = [r for r in cut.result.records if r.done]
    assert 0 < len(done) < len(WL.requests) and sum(missed(r) for r in done) == 1
    for r in done:  # what finished before the stop finished as in the full run
        f = by_id[r.request_id]
        assert (r.instance, r.finish_s, r.ttft_s) == (f.instance, f.finish_s, f.ttft_s)
    assert not any(r.failed for r in cut.result.records)  # under way at the stop: unfinished, not failed
    assert len(cut.result.records) < len(WL.requests)  # the later arrivals never came


def test_a_stop_that_never_answers_true_changes_nothing():
    bundle = PolicyBundle("jsq", dispatch="jsq", engine="fcfs")
    full = simulate(SPEC, WL, bundle, plan=PLAN)
    asked: list[str] = []
    run = simulate(SPEC, WL, bundle, plan=PLAN, stop=lambda r: asked.append(r.request_id) or False)
    assert run.result.stopped_s is None and "stopped_s" not in run.report
    assert sorted(asked) == sorted(r.request_id for r in full.result.records if r.done)
    key = [(r.request_id, r.instance, r.finish_s, r.failed) for r in full.result.records]
    assert [(r.request_id, r.instance, r.finish_s, r.failed) for r in run.result.records] == key
    assert not math.isnan(run.report["overall"]["ttft_s"]["mean"])
