"""The pure parts of ``tools.bench.sim_fidelity`` (the fidelity benchmark itself needs a live cluster):
workload planning, prompts, metrics, the overhead fit from calibration groups, the calibrated record,
and that a simulation of a planned workload runs with the tool's settings."""

from __future__ import annotations

import math
import random

import pytest
from llmfleet.costmodel import ProfileRecord, model_arch, roofline_record
from llmfleet.costmodel.aladdin import DecodeModel, PrefillModel
from llmfleet.costmodel.hardware import hardware

from tools.bench import sim_fidelity as fid

approx = pytest.approx


def test_planned_workload_is_seeded_and_in_range():
    s = fid.Settings(requests=300, rate_rps=10.0, seed=3)
    a, b = fid.plan_workload(s), fid.plan_workload(s)
    assert a == b
    assert a != fid.plan_workload(fid.Settings(requests=300, rate_rps=10.0, seed=4))
    assert [r.request_id for r in a] == [f"r{i}" for i in range(300)]
    times = [r.arrival_s for r in a]
    assert times == sorted(times) and times[0] > 0
    assert 300 / times[-1] == approx(10.0, rel=0.2)  # Poisson at the asked rate
    assert {r.prompt_tokens for r in a} <= set(range(s.prompt_min, s.prompt_max + 1))
    assert {r.output_tokens for r in a} <= set(range(s.output_min, s.output_max + 1))


def test_prompt_has_one_symbol_per_token_after_bos():
    p = fid.make_prompt(40, random.Random(0))
    assert len(p) == 39 and set(p) <= set(fid.PROMPT_ALPHABET)
    assert p == fid.make_prompt(40, random.Random(0))
    with pytest.raises(ValueError):
        fid.make_prompt(1, random.Random(0))


def test_summary_metrics_by_hand():
    rows = [
        {"arrival_s": 0.0, "first_token_s": 0.1, "finish_s": 1.1, "output_tokens": 11},
        {"arrival_s": 1.0, "first_token_s": 1.3, "finish_s": 2.0, "output_tokens": 8},
        {"arrival_s": 2.0, "first_token_s": 2.2, "finish_s": 4.0, "output_tokens": 1},
    ]
    s = fid.summarize(rows)
    assert s["latency_mean_s"] == approx((1.1 + 1.0 + 2.0) / 3)
    assert s["ttft_mean_s"] == approx(0.2)
    assert s["tpot_mean_s"] == approx((1.0 / 10 + 0.7 / 7) / 2)  # one-token outputs have no TPOT
    assert s["makespan_s"] == approx(4.0)
    assert s["throughput_rps"] == approx(3 / 4.0)
    assert s["throughput_tokens_per_s"] == approx(20 / 4.0)
    assert fid.rel_diff(0.9, 1.0) == approx(-0.1)
    assert math.isnan(fid.rel_diff(1.0, 0.0))
    runs = [{"m": 1.0}, {"m": 3.0}]
    assert fid.mean_summary(runs) == {"m": 2.0}
    assert fid.spread(runs) == {"m": approx(1.0)}


def _group(b, iteration, ttft, prompt=32, out=64):
    lat = ttft + iteration * (out - 1)
    return fid.CalibrationGroup(b, prompt, out, (ttft,) * b, (lat,) * b)


def test_overhead_fit_recovers_a_linear_excess():
    pre, dec = PrefillModel(k1=1e-5, c1=2e-4), DecodeModel(k2=1e-7, c2=3e-5, c3=6e-4)
    o3, o2, o1 = 1e-3, 2e-4, 3e-3
    groups = []
    for b in (1, 2, 4, 8):
        g = _group(b, 0.0, 0.0)
        live = dec.predict(b, g.mean_context) + o3 + o2 * b
        groups.append(_group(b, live, pre.predict(32) + o1))
    o = fid.fit_overhead(groups, pre, dec)
    assert o.per_iteration_s == approx(o3, rel=1e-6)
    assert o.per_sequence_s == approx(o2, rel=1e-6)
    assert o.prefill_s == approx(o1, rel=1e-6)
    assert [b for b, _ in o.points] == [1, 2, 4, 8]


def test_overhead_fit_means_repeats_and_clamps():
    pre, dec = PrefillModel(k1=1e-5, c1=2e-4), DecodeModel(k2=0.0, c2=0.0, c3=1e-3)
    # two groups at b=1: a quiet (1 ms excess) and a contended one (3 ms): the mean, 2 ms, counts
    groups = [_group(1, 2e-3, pre.predict(32)), _group(1, 4e-3, pre.predict(32))]
    o = fid.fit_overhead(groups, pre, dec)
    assert o.per_iteration_s == approx(2e-3) and o.per_sequence_s == 0.0
    assert o.prefill_s == approx(0.0, abs=1e-12)
    faster = [_group(1, 0.5e-3, 0.0)]  # faster than the fit: no negative overhead
    o = fid.fit_overhead(faster, pre, dec)
    assert o.per_iteration_s == 0.0 and o.prefill_s == 0.0
    with pytest.raises(ValueError):
        fid.fit_overhead([], pre, dec)


def test_calibrated_record_adds_the_overheads():
    rec = roofline_record(model_arch("tiny-llama"), hardware("cpu"), date="2026-01-01T00:00:00+00:00")
    o = fid.Overhead(prefill_s=1e-3, per_iteration_s=2e-3, per_sequence_s=3e-4, points=())
    cal = fid.with_overhead(rec, o)
    assert isinstance(cal, ProfileRecord)
    a, c = rec.aladdin, cal.aladdin
    assert (c.prefill.k1, c.decode.k2) == (a.prefill.k1, a.decode.k2)
    assert c.prefill.c1 == approx(a.prefill.c1 + 1e-3)
    assert c.decode.c3 == approx(a.decode.c3 + 2e-3)
    assert c.decode.c2 == approx(a.decode.c2 + 3e-4)
    assert ProfileRecord.from_json(cal.to_json()) == cal


def test_simulating_a_planned_workload():
    s = fid.Settings(requests=60, rate_rps=20.0, max_batch=4)
    planned = fid.plan_workload(s)
    rows = [
        {"request_id": p.request_id, "planned_arrival_s": p.arrival_s, "prompt_tokens": p.prompt_tokens,
         "output_tokens": p.output_tokens}
        for p in planned
    ]  # fmt: skip
    rec = roofline_record(model_arch("tiny-llama"), hardware("cpu"), date="2026-01-01T00:00:00+00:00")
    rec = fid.with_overhead(rec, fid.Overhead(1e-3, 1e-3, 1e-4, ()))
    out = fid.simulate(rows, rec, s, kv_bytes=64 << 20, block_tokens=128)
    summary = out["summary"]
    assert summary["requests"] == 60
    assert out["cost_models"] == {"tiny-llama@tp1": "fitted:cpu:roofline"}
    assert summary["ttft_mean_s"] > 0 and summary["latency_p99_s"] >= summary["latency_p50_s"]
    # every output token comes from one iteration: at most max_batch tokens per iteration
    assert 1.0 <= out["mean_batch"] <= s.max_batch
    assert fid.simulate(rows, rec, s, kv_bytes=64 << 20, block_tokens=128)["summary"] == summary
    # a hop delays every first token and finish by the same amount: the schedule itself is unchanged
    hop = fid.simulate(rows, rec, s, kv_bytes=64 << 20, block_tokens=128, hop_s=0.01)["summary"]
    assert hop["latency_mean_s"] == approx(summary["latency_mean_s"] + 0.01)
    assert hop["ttft_mean_s"] == approx(summary["ttft_mean_s"] + 0.01)
    assert hop["tpot_mean_s"] == approx(summary["tpot_mean_s"])


def test_deployed_overhead_takes_decode_from_the_cluster_and_the_hop_from_ttfts():
    pre, dec = PrefillModel(k1=1e-5, c1=2e-4), DecodeModel(k2=1e-7, c2=3e-5, c3=6e-4)
    engine, cluster = [], []
    for b in (1, 2, 4):
        base = dec.predict(b, _group(b, 0.0, 0.0).mean_context)
        engine.append(_group(b, base + 1e-3, pre.predict(32) + 2e-3))  # o3 1 ms, o1 2 ms
        # through the cluster: iterations 0.5 ms + 0.1 ms per sequence slower, first tokens 7 ms later
        cluster.append(_group(b, base + 1.5e-3 + 1e-4 * b, pre.predict(32) + 2e-3 + 7e-3))
    o, hop = fid.deployed_overhead(fid.fit_overhead(engine, pre, dec), engine, cluster, pre, dec)
    assert o.per_iteration_s == approx(1.5e-3, rel=1e-6) and o.per_sequence_s == approx(1e-4, rel=1e-6)
    assert o.prefill_s == approx(2e-3, rel=1e-6)  # a first iteration's own cost: engine side
    assert hop == approx(7e-3, rel=1e-6)


def test_little_latency_integrates_the_load():
    # 2 requests in the engine for 0.1 s, then 1 for 0.2 s, then none: 0.4 request-seconds / 2 requests
    samples = [(10.0, 2), (10.1, 1), (10.3, 0), (10.4, 0)]
    assert fid.little_latency(samples, 2) == approx(0.2)
    assert fid.little_latency([], 0) == 0.0
