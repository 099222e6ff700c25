"""SCLS (Cheng et al. 2024): the slice DP batcher (Alg. 1, Eq. 10), max-min offloading (Eq. 11) and the
adaptive interval (Eq. 12)."""

import itertools
import math
import random

import pytest
from llmfleet.costmodel import SclsDecode, SclsModel, SclsPrefill
from llmfleet.policies.batching import (
    POLICIES,
    SclsOptions,
    SclsSliceBatcher,
    StaticBatch,
    StaticBatchPolicy,
    dp_batches,
    make_batching_policy,
    padded_blocks,
)
from llmfleet.policies.dispatch import (
    DispatchRequest,
    EngineCandidate,
    SclsMaxMin,
    SclsMaxMinOptions,
    adaptive_interval,
    make_dispatch_policy,
)
from llmfleet.policies.request import BatchLimits, PoolView, SchedRequest

S = 128
TPB = 16
# Figure 11 (LLaMA2-13B, HF, S = 128): 15 prompts of 10 tokens + 1 of 1024 take 13.5 s as one padded
# batch and 7.6 s as two. These coefficients (p: prefill, d: per-iteration decode; Eq. 3–4) land near
# that: 13.56 s together, 7.83 s apart.
FIG11 = SclsModel(SclsPrefill(2.8e-4, 0.0, 0.0, 0.2), SclsDecode(2.5e-6, 0.0, 0.0, 0.025))
# Padding almost free, per-batch overhead (p4, S·d4) dominant: one batch is cheaper.
OVERHEAD = SclsModel(SclsPrefill(1e-6, 0.0, 0.0, 0.2), SclsDecode(1e-8, 0.0, 0.0, 0.025))
BIG = BatchLimits(max_requests=10_000, max_prefill_tokens=10**9)


def ts(model, s=S):
    return lambda n, ln: model.t_serve(n, ln, s)


def always(n, ln):
    return True


def total(model, lengths, groups, s=S):
    return sum(model.t_serve(len(g), max(lengths[k] for k in g), s) for g in groups)


def pool(free=100_000, watermark=0):
    return PoolView(free, watermark, {"m": TPB, "n": TPB})


def w(rid, arrival, prompt, model="m"):
    return SchedRequest(rid, "svc", model, arrival, prompt, 512)


# ------------------------------------------------------------------------------ Figure 11


def fig11_lengths():
    lengths = [10] * 15 + [1024]
    random.Random(3).shuffle(lengths)
    return lengths


def test_figure11_two_batches_beat_one_padded_batch():
    lengths = fig11_lengths()
    together = FIG11.t_serve(16, 1024, S)
    apart = FIG11.t_serve(15, 10, S) + FIG11.t_serve(1, 1024, S)
    assert together == pytest.approx(13.56064) and together == pytest.approx(FIG11.t_serve_sum(16, 1024, S))
    assert apart == pytest.approx(7.83464)  # the paper: 13.5 s vs 7.6 s
    groups = dp_batches(lengths, ts(FIG11), always)
    long_idx = lengths.index(1024)
    assert groups == [sorted(k for k in range(16) if k != long_idx), [long_idx]]
    assert total(FIG11, lengths, groups) == pytest.approx(apart)


def test_figure11_one_batch_when_that_is_cheaper():
    lengths = fig11_lengths()
    assert OVERHEAD.t_serve(16, 1024, S) < OVERHEAD.t_serve(15, 10, S) + OVERHEAD.t_serve(1, 1024, S)
    assert dp_batches(lengths, ts(OVERHEAD), always) == [sorted(range(16), key=lambda k: (lengths[k], k))]


def test_figure11_through_the_batcher():
    lengths = fig11_lengths()
    waiting = [w(f"r{i:02d}", float(i), ln) for i, ln in enumerate(lengths)]
    long_id = f"r{lengths.index(1024):02d}"
    b = SclsSliceBatcher(SclsOptions(cost=FIG11, zeta=1.0))
    first = b.form_batch(waiting, pool(), BIG, 0.0)
    assert first.max_iterations == S and first.model == "m"
    if long_id == "r00":  # the batch holding the oldest request comes first
        assert first.request_ids == ("r00",)
    else:
        assert (
            "r00" in first.request_ids and len(first.request_ids) == 15 and long_id not in first.request_ids
        )
    rest = [r for r in waiting if r.request_id not in first.request_ids]
    second = b.form_batch(rest, pool(), BIG, 0.0)
    assert sorted(first.request_ids + second.request_ids) == sorted(r.request_id for r in waiting)
    assert b.form_batch([], pool(), BIG, 0.0) is None


# ------------------------------------------------------------------------------ DP optimality


def brute_force(lengths, t_serve, fits):
    """Minimum over every split of the length-sorted order into contiguous runs (runs > 1 must fit)."""
    order = sorted(range(len(lengths)), key=lambda k: (lengths[k], k))
    ls = [lengths[k] for k in order]
    best = math.inf
    for cuts in itertools.product([False, True], repeat=len(ls) - 1):
        runs, start = [], 0
        for i, cut in enumerate(cuts, start=1):
            if cut:
                runs.append((start, i))
                start = i
        runs.append((start, len(ls)))
        if any(b - a > 1 and not fits(b - a, ls[b - 1]) for a, b in runs):
            continue
        best = min(best, sum(t_serve(b - a, ls[b - 1]) for a, b in runs))
    return best


def random_model(rng):
    return SclsModel(
        SclsPrefill(rng.uniform(0, 1e-3), rng.uniform(0, 0.05), rng.uniform(0, 1e-3), rng.uniform(0, 1)),
        SclsDecode(rng.uniform(0, 1e-5), rng.uniform(0, 1e-3), rng.uniform(0, 1e-5), rng.uniform(0, 0.05)),
    )


def test_dp_matches_brute_force_on_random_cases():
    rng = random.Random(7)
    for _ in range(150):
        n = rng.randint(1, 9)
        lengths = [rng.choice([1, 5, 10, 64, 100, 300, 512, 1000]) for _ in range(n)]
        model = random_model(rng)
        s = rng.choice([16, 128])
        budget = rng.choice([math.inf, 300, 1200, 4000])

        def fits(k, ln, budget=budget, s=s):
            return k * (ln + s) <= budget

        groups = dp_batches(lengths, ts(model, s), fits)
        assert sorted(k for g in groups for k in g) == list(range(n))  # a partition
        flat = [k for g in groups for k in g]
        assert flat == sorted(range(n), key=lambda k: (lengths[k], k))  # contiguous runs, ascending
        assert all(len(g) == 1 or fits(len(g), max(lengths[k] for k in g)) for g in groups)
        assert total(model, lengths, groups, s) == pytest.approx(
            brute_force(lengths, ts(model, s), fits), rel=1e-9
        )


def test_dp_scalar_fallback_agrees_with_vectorised_cost():
    rng = random.Random(11)
    lengths = [rng.randint(1, 1024) for _ in range(60)]

    def scalar(n, ln):  # int() rejects arrays: forces the scalar path
        return FIG11.t_serve(int(n), int(ln), S)

    def fits(k, ln):
        return k * (ln + S) <= 6000

    assert dp_batches(lengths, scalar, fits) == dp_batches(lengths, ts(FIG11), fits)


def test_dp_ties_prefer_the_shortest_last_run():
    # every partition costs the same (t = n): Algorithm 1 keeps the first (single) batch on ties
    assert dp_batches([3, 1, 2], lambda n, ln: n, always) == [[1], [2], [0]]
    assert dp_batches([], ts(FIG11), always) == []


# ------------------------------------------------------------------------------ OOM bound


def test_runs_stop_at_the_first_oom():
    lengths = [100] * 12
    calls = []

    def fits(k, ln):
        calls.append(k)
        return k * (ln + S) <= 4 * (100 + S)  # N_max = 4

    groups = dp_batches(lengths, ts(OVERHEAD), fits)
    assert [len(g) for g in groups] == [4, 4, 4]  # unbounded, OVERHEAD would make one batch of 12
    assert len(dp_batches(lengths, ts(OVERHEAD), always)) == 1
    assert max(calls) <= 8 and len(calls) <= 6  # galloping + bisection, once per distinct length


def sizes(b, waiting, pl, limits=BIG):
    return [len(batch.request_ids) for batch, _ in b.plan(waiting, pl, limits)]


def test_batcher_respects_padded_memory_with_zeta():
    # 16-token blocks; prompt 100 + S = 228 tokens → 15 blocks a row; ⌊0.9·100⌋ = 90 blocks → N_max = 6.
    # Equal prompts and a cost linear in N: every split into ⌈20/N_max⌉ batches costs the same.
    waiting = [w(f"r{i:02d}", float(i), 100) for i in range(20)]
    b = SclsSliceBatcher(SclsOptions(cost=OVERHEAD, zeta=0.9))
    got = sizes(b, waiting, pool(free=100))
    assert max(got) == 6 and len(got) == 4
    for batch, _ in b.plan(waiting, pool(free=100), BIG):
        assert padded_blocks(pool(), [r for r in waiting if r.request_id in batch.request_ids], S) <= 90
    assert len(b.form_batch(waiting, pool(free=100), BIG, 0.0).request_ids) <= 6
    assert max(sizes(SclsSliceBatcher(SclsOptions(cost=OVERHEAD, zeta=1.0)), waiting, pool(free=100))) == 6
    assert max(sizes(SclsSliceBatcher(SclsOptions(cost=OVERHEAD, zeta=1.0)), waiting, pool(free=105))) == 7
    # the engine's limits and max_batch bound runs too
    assert max(sizes(b, waiting, pool(), BatchLimits(max_requests=3, max_prefill_tokens=10**9))) == 3
    assert max(sizes(b, waiting, pool(), BatchLimits(max_requests=99, max_prefill_tokens=500))) == 5
    assert max(sizes(SclsSliceBatcher(SclsOptions(cost=OVERHEAD, max_batch=2)), waiting, pool())) == 2
    assert sizes(b, waiting, pool()) == [20]


def test_single_request_always_allowed_unless_it_cannot_be_admitted():
    # 1000 + S tokens = 71 blocks > ⌊0.9·72⌋ = 64: OOM within the slice, but a lone request still runs
    waiting = [w("big", 0.0, 1000), w("small", 1.0, 10)]
    b = SclsSliceBatcher(SclsOptions(cost=OVERHEAD))
    assert b.form_batch(waiting, pool(free=72), BIG, 0.0) == StaticBatch("m", ("big",), S)
    # padded admission (prompt + 1 = 63 blocks) does not fit 62 blocks: "big" is passed over
    assert b.form_batch(waiting, pool(free=62), BIG, 0.0).request_ids == ("small",)
    assert b.form_batch(waiting[:1], pool(free=62), BIG, 0.0) is None


# ------------------------------------------------------------------------------ batcher behaviour


class CountingCost:
    def __init__(self, model):
        self.model, self.calls = model, 0

    def t_serve(self, n, ln, s):
        self.calls += 1
        return self.model.t_serve(n, ln, s)


def test_plan_is_kept_until_the_waiting_set_changes():
    # 10 short prompts padded to 1000 would cost more than a second batch's overhead (as in Figure 11)
    waiting = [w(f"a{i}", float(i), 10) for i in range(10)] + [w(f"b{i}", 10.0 + i, 1000) for i in range(3)]
    cost = CountingCost(FIG11)
    b = SclsSliceBatcher(SclsOptions(cost=cost, zeta=1.0))
    first = b.form_batch(waiting, pool(), BIG, 0.0)
    assert first.request_ids == tuple(f"a{i}" for i in range(10))
    calls = cost.calls
    rest = [r for r in waiting if r.request_id not in first.request_ids]
    assert b.form_batch(rest, pool(), BIG, 0.0).request_ids == ("b0", "b1", "b2")
    assert cost.calls == calls  # served from the kept plan: no DP
    newcomer = w("c0", 20.0, 5)
    b.form_batch(waiting, pool(), BIG, 0.0)
    calls = cost.calls
    again = b.form_batch([*rest, newcomer], pool(), BIG, 0.0)  # an arrival: recomputed
    assert cost.calls > calls  # one short prompt is cheaper padded into the long batch than alone
    assert again.request_ids == ("c0", "b0", "b1", "b2")


def test_one_model_the_oldest_requests():
    waiting = [w("n0", 0.0, 10, model="n"), w("m0", 1.0, 10), w("n1", 2.0, 10, model="n")]
    b = SclsSliceBatcher(SclsOptions(cost=OVERHEAD))
    assert b.form_batch(waiting, pool(), BIG, 0.0) == StaticBatch("n", ("n0", "n1"), S)
    plan = b.plan(waiting[1:], pool(), BIG)
    assert plan == [(StaticBatch("m", ("m0",), S), pytest.approx(OVERHEAD.t_serve(1, 10, S)))]
    assert b.estimate(waiting[:2]) == pytest.approx(OVERHEAD.t_serve(2, 10, S))


def test_on_batch_done_marks_members():
    waiting = [w("a", 0.0, 10), w("b", 1.0, 10)]
    b = SclsSliceBatcher(SclsOptions(cost=OVERHEAD))
    batch = StaticBatch("m", ("a",), S)
    b.on_batch_done(batch, 2.0, 5.0, waiting)
    assert (waiting[0].first_scheduled_s, waiting[0].last_run_s) == (3.0, 5.0)
    assert waiting[1].last_run_s is None
    with pytest.raises(ValueError):
        b.on_batch_done(batch, -1.0, 5.0, waiting)


def test_registry_and_options():
    assert POLICIES["scls"] is SclsSliceBatcher
    p = make_batching_policy("scls", slice_iterations=64, zeta=1.0)
    assert isinstance(p, StaticBatchPolicy) and p.name == "scls" and p.slice_iterations == 64
    coeffs = {"prefill": FIG11.prefill.to_dict(), "decode": FIG11.decode.to_dict()}
    assert make_batching_policy("scls", cost=coeffs).cost == FIG11
    assert SclsSliceBatcher().cost.t_serve(1, 10, S) > 0  # default: roofline LLaMA2-13B / A100-80GB
    for bad in ({"slice_iterations": 0}, {"zeta": 0}, {"zeta": 1.5}, {"max_batch": 0}, {"cost": object()}):
        with pytest.raises(ValueError, match="bad options for batching policy 'scls'"):
            make_batching_policy("scls", **bad)


# ------------------------------------------------------------------------------ max-min offloading


def test_max_min_longest_first_to_least_loaded():
    mm = SclsMaxMin(SclsMaxMinOptions(FIG11))
    batches = [("e", 2.0), ("a", 5.0), ("c", 3.0), ("b", 4.0), ("d", 3.0), ("f", 2.0), ("g", 1.0)]
    got = mm.assign_batches(batches, ["w0", "w1"])
    # LPT: a→w0 (5), b→w1 (4), c→w1 (7), d→w0 (8), e→w1 (9), f→w0 (10), g→w1 (10)
    assert got == [("a", "w0"), ("b", "w1"), ("c", "w1"), ("d", "w0"), ("e", "w1"), ("f", "w0"), ("g", "w1")]
    assert mm.loads == {"w0": 10.0, "w1": 10.0}
    mm.complete_batch("a")  # load −= the estimate (5), whatever the batch actually took
    assert mm.load("w0") == pytest.approx(5.0)
    mm.complete_batch("a")  # already completed: no-op
    assert mm.load("w0") == pytest.approx(5.0)
    assert mm.assign_batches([("h", 1.0)], ["w0", "w1"]) == [("h", "w0")]
    with pytest.raises(ValueError):
        mm.assign_batches([("x", 1.0)], [])


def dreq(rid, prompt=100, predicted=0.0):
    return DispatchRequest(rid, "m", prompt_tokens=prompt, predicted_output_tokens=predicted)


def cands(*ids):
    return [EngineCandidate(i, ("m",)) for i in ids]


def test_request_estimate_slice_by_slice():
    mm = SclsMaxMin(SclsMaxMinOptions(FIG11))
    three = FIG11.t_serve(1, 100, 128) + FIG11.t_serve(1, 228, 128) + FIG11.t_serve(1, 356, 44)
    assert mm.request_estimate(dreq("r", 100, 300.0)) == pytest.approx(three)  # ⌈300/128⌉ = 3 slices
    assert mm.request_estimate(dreq("r", 100, 0.0)) == pytest.approx(FIG11.t_serve(1, 100, 128))  # unknown
    assert mm.request_estimate(None) == pytest.approx(FIG11.t_serve(1, 0, 128))


def test_choose_least_load_and_finish_subtracts_the_estimate():
    mm = SclsMaxMin(SclsMaxMinOptions(FIG11))
    long_r, short_r = dreq("long", 1000, 1000.0), dreq("short", 10, 5.0)
    est_long, est_short = mm.request_estimate(long_r), mm.request_estimate(short_r)
    assert mm.choose("m", cands("e1", "e0"), request=long_r) == "e0"  # tie at 0: smaller id
    assert mm.choose("m", cands("e0", "e1"), request=short_r) == "e1"
    assert mm.choose("m", cands("e0", "e1"), request=dreq("s2", 10, 5.0)) == "e1"  # e1 still lighter
    assert mm.load("e0") == pytest.approx(est_long) and mm.load("e1") == pytest.approx(2 * est_short)
    mm.on_finish("long", "e0", output_tokens=3, now=99.0)  # the estimate, not what it produced
    assert mm.load("e0") == pytest.approx(0.0)
    mm.on_finish("long", "e0", 3, 99.0)  # unknown now: no-op
    mm.on_finish("nope", "e1", 3, 99.0)
    assert mm.load("e1") == pytest.approx(2 * est_short)
    # re-dispatch of the same request releases its old estimate first
    assert mm.choose("m", cands("e0", "e1"), request=dreq("s2", 10, 5.0)) == "e0"
    assert mm.load("e1") == pytest.approx(est_short) and mm.load("e0") == pytest.approx(est_short)
    assert mm.choose("m", cands("e0", "e1"), frozenset({"e0"}), request=dreq("x")) == "e1"


def test_adaptive_interval():
    assert adaptive_interval([20.0, 30.0]) == pytest.approx(10.0)  # 0.5 · min load
    assert adaptive_interval([4.0, 30.0]) == 6.0  # Γ (HF)
    assert adaptive_interval([4.0, 30.0], gamma_s=3.0) == 3.0  # Γ (DeepSpeed)
    assert adaptive_interval([], 0.5, 6.0) == 6.0
    mm = SclsMaxMin(SclsMaxMinOptions(FIG11, lam=0.5, gamma_s=1.0))
    mm.assign_batches([("a", 8.0), ("b", 6.0)], ["w0", "w1"])
    assert mm.interval() == pytest.approx(3.0)
    assert mm.interval(["w0", "w1", "idle"]) == 1.0  # an idle worker: min load 0 → Γ
    mm.complete_batch("b")
    assert mm.interval() == 1.0


def test_dispatch_registry():
    p = make_dispatch_policy("scls_maxmin", cost=FIG11, slice_iterations=64, gamma_s=3.0)
    assert isinstance(p, SclsMaxMin) and p.name == "scls_maxmin" and p.slice_iterations == 64
    for bad in ({"lam": 0}, {"lam": 2}, {"gamma_s": -1}, {"slice_iterations": 0}):
        with pytest.raises(ValueError, match="bad options for dispatch policy 'scls_maxmin'"):
            make_dispatch_policy("scls_maxmin", **bad)
