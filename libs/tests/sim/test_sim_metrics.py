"""Metrics on hand-built records and samples: distributions, SLO attainment per paper, cluster figures."""

from __future__ import annotations

import itertools
import math

import pytest
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.sim.metrics import cluster_metrics, dist, mean_active_gpus, request_metrics, summarize
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.simulator import Sample, SimResult
from llmfleet.sim.spec import SimService
from llmfleet.types import Slo
from llmfleet.workload import WorkloadRequest as W

approx = pytest.approx

SVC = SimService("s", "llama2-7b", Slo(ttft_s=1.0, tpot_s=0.1, latency_scale=5.0, deadline_s=5.0))


def rec(rid, arrival, first, finish, out=11, solo=1.0, service="s", failed=""):
    return RequestRecord(
        rid,
        service,
        "llama2-7b",
        arrival,
        10,
        out,
        "i0",
        first,
        finish,
        out if finish else 0,
        solo,
        failed=failed,
    )


def slo_records():
    return [
        # A: TTFT 0.5 ≤ 1, ATGT (1.5 − 0.5)/10 = 0.1 ≤ 0.1, latency 1.5 ≤ 5·1.0, 1.5 ≤ 5 → meets all three
        rec("A", 0.0, 0.5, 1.5, solo=1.0),
        # B: TTFT 2 > 1 (Aladdin miss), latency 3 > 5·0.5 (SeaLLM miss), 3 ≤ 5 (UELLM ok)
        rec("B", 1.0, 3.0, 4.0, solo=0.5),
        # C: TTFT 0.2, ATGT 6/10 = 0.6 > 0.1 (Aladdin miss), latency 6.2 ≤ 5·2 (SeaLLM ok), 6.2 > 5 (UELLM miss)
        rec("C", 2.0, 2.2, 8.2, solo=2.0),
        # D: failed — misses everything
        rec("D", 3.0, None, None, solo=0.0, failed="prompt of 9999 tokens needs 625 KV blocks"),
    ]


def test_slo_attainment_per_definition():
    m = request_metrics(slo_records(), [SVC])
    assert m["requests"] == 4 and m["completed"] == 3 and m["failed"] == 1
    assert m["slo"] == {"aladdin": approx(1 / 4), "seallm": approx(2 / 4), "uellm": approx(2 / 4)}
    assert m["ttft_s"]["n"] == 3 and m["ttft_s"]["mean"] == approx((0.5 + 2.0 + 0.2) / 3)
    assert m["tpot_s"]["max"] == approx(0.6)
    assert m["latency_s"]["mean"] == approx((1.5 + 3.0 + 6.2) / 3)
    # normalized latency divides by the service's mean execution time: mean(1.0, 0.5, 2.0) = 7/6
    assert m["normalized_latency"]["max"] == approx(6.2 / (3.5 / 3))
    assert m["normalized_latency"]["mean"] == approx((1.5 + 3.0 + 6.2) / 3 / (3.5 / 3))


def test_latency_scale_and_definitions_only_for_services_that_set_them():
    strict = SimService("strict", "llama2-7b", Slo(latency_scale=1.2))  # no TTFT/ATGT, no deadline
    loose = SimService("loose", "llama2-7b", Slo(ttft_s=10.0, tpot_s=10.0))
    recs = [
        rec("x", 0.0, 0.1, 1.3, solo=1.0, service="strict"),  # 1.3 > 1.2·1.0: SeaLLM miss
        rec("y", 0.0, 0.1, 1.1, solo=1.0, service="strict"),  # 1.1 ≤ 1.2: ok
        rec("z", 0.0, 0.1, 4.0, solo=1.0, service="loose"),  # 4 ≤ 5: ok; Aladdin ok
    ]
    m = request_metrics(recs, [strict, loose])
    assert m["slo"]["seallm"] == approx(2 / 3)
    assert m["slo"]["aladdin"] == 1.0  # only "loose" counts
    assert "uellm" not in m["slo"]  # nobody sets a deadline
    assert request_metrics(recs[:2], [strict, loose])["slo"] == {"seallm": 0.5}


def test_failed_requests_from_the_simulator_are_misses(tiny):
    """A service whose model no instance hosts: every request fails at dispatch and misses every SLO."""
    ok = SimService("ok", "llama2-7b", Slo(ttft_s=10.0, tpot_s=10.0, deadline_s=100.0))
    orphan = SimService("orphan", "llama3-8b", Slo(ttft_s=10.0, tpot_s=10.0, deadline_s=100.0))
    sim = tiny.sim(services=[ok, orphan], plan=[InstancePlan("i0", ("llama2-7b",), 1)])
    res = sim.run([W("a", 0.0, 10, 3, "ok"), W("b", 0.1, 10, 3, "orphan")])
    b = next(r for r in res.records if r.request_id == "b")
    assert not b.done and "llama3-8b" in b.failed and "no engine" in b.failed
    rep = summarize(res, sim.spec.services)
    assert rep["overall"]["slo"] == {"seallm": 0.5, "aladdin": 0.5, "uellm": 0.5}
    assert rep["services"]["ok"]["slo"]["seallm"] == 1.0
    assert rep["services"]["orphan"]["slo"] == {"seallm": 0.0, "aladdin": 0.0, "uellm": 0.0}
    assert rep["overall"]["failed"] == 1 and rep["overall"]["completed"] == 1


def test_dist_known_values():
    d = dist([float(v) for v in range(1, 11)])  # 1..10, numpy's linear interpolation
    assert d == {"n": 10, "mean": 5.5, "p50": 5.5, "p90": approx(9.1), "p99": approx(9.91), "max": 10.0}
    assert dist([3.0]) == {"n": 1, "mean": 3.0, "p50": 3.0, "p90": 3.0, "p99": 3.0, "max": 3.0}
    assert dist([]) == {"n": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    assert all(not math.isnan(v) for v in dist([]).values())


def test_cluster_metrics_hand_built():
    recs = [
        rec("a", 0.0, 0.5, 2.0, out=10),
        rec("b", 1.0, 1.5, 4.0, out=30),
        rec("c", 1.5, None, None, failed="x"),
    ]
    samples = [
        Sample(0.0, kv_used=10, kv_capacity=100, active_gpus=2, in_system=1),
        Sample(1.0, kv_used=50, kv_capacity=100, active_gpus=3, in_system=2),
        Sample(3.0, kv_used=0, kv_capacity=100, active_gpus=0, in_system=0),
    ]
    inst = [
        {"tp": 2, "busy_s": 3.0, "iterations": 7, "adapter_loads": 4},
        {"tp": 1, "busy_s": 1.5, "iterations": 5, "adapter_loads": 0},
    ]
    res = SimResult(recs, samples, inst, end_s=4.0, events=40, wall_s=2.0, provisioned_gpus=3)
    c = cluster_metrics(res)
    assert c["makespan_s"] == 4.0  # first arrival 0 → last finish 4
    assert c["throughput_rps"] == approx(2 / 4)  # completed / makespan (the failed one does not count)
    assert c["throughput_tokens_per_s"] == approx(40 / 4)
    assert c["gpu_seconds_busy"] == approx(2 * 3.0 + 1 * 1.5)
    assert c["gpu_seconds_provisioned"] == approx(3 * 4.0)
    assert c["peak_active_gpus"] == 3
    # step function 2 on [0,1), 3 on [1,3), 0 on [3,4] → (2 + 6 + 0) / 4
    assert c["mean_active_gpus"] == approx(2.0)
    assert c["kv_utilization_mean"] == approx(0.2) and c["kv_utilization_peak"] == approx(0.5)
    assert (
        c["iterations"] == 12
        and c["adapter_loads"] == 4
        and c["events"] == 40
        and c["events_per_s"] == approx(20.0)
    )
    assert mean_active_gpus([], 5.0) == 0.0
    assert mean_active_gpus([Sample(2.0, 0, 0, 4, 0)], 2.0) == 4.0  # a single instant


def test_cluster_metrics_from_a_tp2_run(tiny):
    """GPU-seconds busy = tp × busy time; throughput = completed / makespan; samples see the 2 GPUs."""
    sim = tiny.sim(tp=2, sample_period_s=0.1)
    res = sim.run([W("a", 0.0, 100, 5, "s"), W("b", 1.05, 100, 5, "s")])
    c = summarize(res, sim.spec.services)["cluster"]
    assert c["gpu_seconds_busy"] == approx(2 * (0.295 + 0.295))
    assert c["makespan_s"] == approx(1.345)
    assert c["throughput_rps"] == approx(2 / 1.345)
    assert c["throughput_tokens_per_s"] == approx(10 / 1.345)
    assert c["provisioned_gpus"] == 2 and c["peak_active_gpus"] == 2
    # samples every 0.1 s from the first arrival while work remains, including the idle gap
    ts = [s.t for s in res.samples]
    assert ts[0] == 0.0 and all(b - a == approx(0.1) for a, b in itertools.pairwise(ts))
    assert ts[-1] == approx(1.4)  # the first tick after the last finish (1.345)
    active = {round(s.t, 6): s.active_gpus for s in res.samples}
    assert [active[t] for t in (0.0, 0.2, 0.3, 0.5, 1.0, 1.1, 1.3, 1.4)] == [2, 2, 0, 0, 0, 2, 2, 0]
    # busy [0, .295] and [1.05, 1.345]; active ticks 0, .1, .2 and 1.1, 1.2, 1.3 → 6 of 14 intervals
    assert c["mean_active_gpus"] == approx(2 * 0.6 / 1.4)
    kv = [s.kv_used for s in res.samples if s.active_gpus]
    assert kv and all(v > 0 for v in kv)
    assert res.samples[-1].kv_used == 0 and res.samples[-1].in_system == 0
