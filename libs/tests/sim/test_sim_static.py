"""Static batching mode (StaticSls): padding, batch-end vs EOS release, iteration slices.

Costs (conftest): prefill 0.1 + 0.001·T + 1e-6·Q, decode 0.01 + 0.001·b + 1e-4·S. A blocker request z
(prompt 10, one token: 0.1 + 0.01 + 0.0001 = 0.1101 s) occupies the instance at t = 0 so that a and b
are both waiting when the next batch forms at 0.1101.
"""

from __future__ import annotations

import math

import pytest
from llmfleet.policies.batching import StaticSls, StaticSlsOptions
from llmfleet.sim.spec import EngineSettings
from llmfleet.workload import WorkloadRequest as W

approx = pytest.approx
Z_END = 0.1101
WORK = [W("z", 0.0, 10, 1, "s"), W("a", 0.01, 10, 3, "s"), W("b", 0.02, 30, 5, "s")]


def batch_ends(tiny):
    """Iteration ends of the padded batch {a, b}: prompts padded to 30, decodes until b's 5th token."""
    t = Z_END + 0.1 + 0.001 * 60 + 1e-6 * 2 * 900  # prefill n·longest = 60 tokens, Q = 2·30²: 0.1618
    ends = [t]
    for i in range(1, 5):  # decode step i: 2 rows of context 30 + i each
        t += 0.01 + 0.002 + 1e-4 * 2 * (30 + i)
        ends.append(t)
    return ends


def records(res):
    return {r.request_id: r for r in res.records}


def test_padding_and_batch_end_release(tiny):
    sim = tiny.sim(
        make_policy=lambda: StaticSls(StaticSlsOptions(batch_size=2)),
        engine=EngineSettings(static_release="batch_end"),
    )
    res = sim.run(WORK)
    r = records(res)
    ends = batch_ends(tiny)
    assert r["z"].finish_s == approx(Z_END, abs=1e-12)
    # both outputs are delivered when the batch ends (HF generate), a's 3 tokens included
    for rid in "ab":
        assert r[rid].first_token_s == approx(ends[-1], abs=1e-12)
        assert r[rid].finish_s == approx(ends[-1], abs=1e-12)
        assert r[rid].produced == r[rid].output_tokens
    assert res.instances[0]["iterations"] == 1 + 5
    assert res.instances[0]["busy_s"] == approx(ends[-1], abs=1e-12)
    assert sim.instances["i0"].alloc.used_blocks == 0


def test_eos_release(tiny):
    sim = tiny.sim(
        make_policy=lambda: StaticSls(StaticSlsOptions(batch_size=2)),
        engine=EngineSettings(static_release="eos"),
    )
    r = records(sim.run(WORK))
    ends = batch_ends(tiny)
    # the padded prefill yields every row's first token; a's EOS is its 3rd token, b's its 5th
    assert r["a"].first_token_s == approx(ends[0], abs=1e-12)
    assert r["b"].first_token_s == approx(ends[0], abs=1e-12)
    assert r["a"].finish_s == approx(ends[2], abs=1e-12)
    assert r["b"].finish_s == approx(ends[4], abs=1e-12)
    assert r["a"].tpot_s == approx((ends[2] - ends[0]) / 2, abs=1e-12)


def test_batch_size_caps_the_batch(tiny):
    """Batch size 1: a runs alone (prefill of 10 tokens, not 2·30), then b alone."""
    sim = tiny.sim(
        make_policy=lambda: StaticSls(StaticSlsOptions(batch_size=1)),
        engine=EngineSettings(static_release="eos"),
    )
    r = records(sim.run(WORK))
    t = Z_END + 0.1 + 0.01 + 1e-4  # a's prefill
    assert r["a"].first_token_s == approx(t, abs=1e-12)
    t += (0.011 + 1e-4 * 11) + (0.011 + 1e-4 * 12)
    assert r["a"].finish_s == approx(t, abs=1e-12)
    t += 0.1 + 0.03 + 1e-6 * 900  # b's prefill
    assert r["b"].first_token_s == approx(t, abs=1e-12)


def test_iteration_slices_return_unfinished_rows(tiny):
    """max_iterations = 2: slices of two iterations; unfinished rows go back to waiting and recompute."""
    sim = tiny.sim(
        make_policy=lambda: StaticSls(StaticSlsOptions(batch_size=2, max_iterations=2)),
        engine=EngineSettings(static_release="eos"),
    )
    seen: list[tuple[str, int]] = []
    inst = sim.instances["i0"]
    form = inst.policy.form_batch

    def spy(waiting, pool, limits, now):
        b = form(waiting, pool, limits, now)
        if b is not None:
            seen.extend(
                (rid, next(w.prompt_tokens for w in waiting if w.request_id == rid)) for rid in b.request_ids
            )
        return b

    inst.policy.form_batch = spy
    res = sim.run(WORK)
    r = records(res)
    assert all(x.done and x.produced == x.output_tokens for x in res.records)
    # slice 1 {a, b}: prefill (60 tokens) + one decode → a has 2 tokens, b 2
    t1 = Z_END + 0.1618 + (0.012 + 1e-4 * 62)
    assert r["a"].first_token_s == approx(Z_END + 0.1618, abs=1e-12)
    # slice 2 {a (12 tokens to recompute), b (32)}: padded prefill 2·32 → a's 3rd token at its end (EOS)
    t2 = t1 + 0.1 + 0.064 + 1e-6 * 2 * 32 * 32
    assert r["a"].finish_s == approx(t2, abs=1e-12)
    # b: slice 2 gives its 3rd and 4th tokens; slice 3 re-prefills 30 + 4 = 34 tokens → the 5th
    t2 += 0.012 + 1e-4 * 2 * 33
    assert r["b"].finish_s == approx(t2 + 0.1 + 0.034 + 1e-6 * 34 * 34, abs=1e-12)
    assert seen == [("z", 10), ("a", 10), ("b", 30), ("a", 12), ("b", 32), ("b", 34)]
    assert res.instances[0]["iterations"] == 1 + 2 + 2 + 1
    assert inst.alloc.used_blocks == 0


def test_static_batch_kv_is_the_padded_prompt_at_start(tiny):
    """While the padded batch runs, the pool holds n rows of ceil(longest / T) blocks at least."""
    sim = tiny.sim(make_policy=lambda: StaticSls(StaticSlsOptions(batch_size=2)))
    seen = []
    sim.every(0.15, lambda s, now: seen.append((now, s.instances["i0"].alloc.used_blocks)))
    sim.run(WORK)
    mid = [u for t, u in seen if Z_END < t < batch_ends(tiny)[-1]]
    assert mid and all(u >= 2 * math.ceil(30 / 16) for u in mid)


def test_static_batch_kv_grows_with_the_decoded_tokens(tiny):
    sim = tiny.sim(make_policy=lambda: StaticSls(StaticSlsOptions(batch_size=1)))
    seen = []
    sim.every(0.5, lambda s, now: seen.append((now, s.instances["i0"].alloc.used_blocks)))
    # one row: prompt 10, 200 output tokens. After k decode steps the time is
    # 0.1101 + 0.012·k + 5e-5·k(k+1) (k = 100 → 1.815 s; the batch ends at ~4.49 s)
    sim.run([W("a", 0.0, 10, 200, "s")])
    # at t = 2 s more than 100 decode steps have run: the row holds ≥ 110 tokens = 7 blocks (it shows 1)
    at2 = [u for t, u in seen if t == 2.0]
    assert at2 and at2[0] >= math.ceil(110 / 16), seen
