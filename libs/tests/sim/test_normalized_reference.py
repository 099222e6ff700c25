"""Normalized latency divides by the solo time at the model's fixed reference TP, whatever the TP of
the instance that served the request, so systems with different tensor parallelism share a denominator."""

from __future__ import annotations

import pytest
from llmfleet.costmodel import hardware
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.replay.report import LiveOutcome, SoloTimes, records_of
from llmfleet.sim.cost import CostBook
from llmfleet.sim.run import preset, simulate
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.workload import Workload
from llmfleet.workload import WorkloadRequest as W

SPEC = SimSpec(
    ClusterSpec(8, hardware("a100-80gb")),
    (SimService("small", "llama2-7b"), SimService("big", "llama2-70b")),
)
WL = Workload((W("a", 0.0, 300, 40, "small"), W("b", 0.1, 500, 20, "big")))


def test_reference_tp_is_the_smallest_that_holds_the_weights():
    assert SPEC.reference_tps() == {"llama2-7b": 1, "llama2-70b": 2}


@pytest.mark.parametrize("tps", [(1, 2), (4, 4)])
def test_solo_time_does_not_follow_the_instance_tp(tps):
    plan = [InstancePlan("s", ("llama2-7b",), tps[0]), InstancePlan("b", ("llama2-70b",), tps[1])]
    e = simulate(SPEC, WL, preset("vllm-v0.4"), plan=plan)
    book = CostBook.build(SPEC.cluster.hw, SPEC.archs())
    solo = {r.request_id: r.solo_s for r in e.result.records}
    assert solo["a"] == pytest.approx(book.solo_time("llama2-7b", 1, 300, 40))
    assert solo["b"] == pytest.approx(book.solo_time("llama2-70b", 2, 500, 20))
    assert book.solo_time("llama2-7b", 4, 300, 40) != pytest.approx(solo["a"])  # TP 4 would differ


def test_reports_name_the_reference():
    e = simulate(SPEC, WL, preset("vllm-v0.4"))
    assert e.report["normalized_reference"] == [
        {"model": "llama2-7b", "hardware": "a100-80gb", "tp": 1},
        {"model": "llama2-70b", "hardware": "a100-80gb", "tp": 2},
    ]


def test_the_live_report_divides_by_the_same_reference():
    """A live run prices a request's solo time at its model's reference TP on the serving engine's
    hardware, as the simulator does, not at the engine's own TP."""
    outcomes = [LiveOutcome("a", "small", 0.0, 0.0, 300, 40, 0.1, 2.0, 40, "e4", "length")]
    engines = {"e4": (4, "a100-80gb")}
    solo = SoloTimes()
    (rec,) = records_of(outcomes, SPEC.services, engines, solo)
    book = CostBook.build(SPEC.cluster.hw, SPEC.archs())
    assert rec.solo_s == pytest.approx(book.solo_time("llama2-7b", 1, 300, 40))
    assert solo.references() == [{"model": "llama2-7b", "hardware": "a100-80gb", "tp": 1}]
