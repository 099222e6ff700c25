"""UELLM SLO-ODBS: the calibrated L1/L2/threshold (preset "paper"), the authors' preset, and the CM-based
batch size (§4.2 Algorithm 1, lines 17/24/26)."""

import math
import time

import pytest
from llmfleet.policies.batching import Odbs, SloDbs, SloOdbs, SloOdbsOptions, make_batching_policy
from llmfleet.policies.batching.slo_odbs import PRESETS, BatchCost, as_batch_cost, calibrate
from llmfleet.policies.engine_policy import make_engine_policy
from llmfleet.policies.request import BatchLimits, PoolView, SchedRequest

TPB = 16
LIMITS = BatchLimits(max_requests=256, max_prefill_tokens=1_000_000)


def pool(free=1_000_000):
    return PoolView(free, 0, {"m": TPB})


def q(rid, out, slo, prompt=16):
    return SchedRequest(
        rid, "svc", "m", 0.0, prompt, 2048, predicted_output_tokens=float(out), deadline_s=slo
    )


def sizes(policy, reqs, free=1_000_000, limits=LIMITS):
    return [len(b.request_ids) for b in policy.partition(reqs, pool(free), limits, 0.0)]


# ------------------------------------------------------------------------------ the derivation


def test_calibration_splits_the_threshold_between_the_terms_at_the_reference():
    l1, l2 = calibrate()
    assert l1 == pytest.approx(15000 / (2 * 351 * 10)) and l2 == pytest.approx(15000 / (2 * 67 * 10))
    p = SloOdbs()  # preset "paper" is the default
    assert (p.preset, p.slo_scale, p.length_scale, p.threshold, p.max_batch) == (
        "paper",
        l1,
        l2,
        15000.0,
        None,
    )
    assert p.sort_output_weight == 0.0  # the listing's sort: SLO ascending
    # the 10th member (n = 9): SLO_q + L_CM = 2 × the midpoint of 1..350 s and a 67-token padding jump
    # each take half of Θ, so together they sit exactly on it
    assert p.slo_term(175.5, 175.5, 9) == pytest.approx(7500.0)
    assert p.length_term(67.0 + 20.0, 20.0, 9) == pytest.approx(7500.0)
    assert p.join_cost(175.5, 87.0, 175.5, 20.0, 9) == pytest.approx(p.threshold)
    # calibrate() is the same derivation on other ranges
    a1, a2 = calibrate((0.0, 100.0), 10.0, 4, 1.0)
    assert (a1, a2) == pytest.approx((0.5 / (2 * 50 * 4), 0.5 / (10 * 4)))
    with pytest.raises(ValueError):
        calibrate((5.0, 5.0))


def test_authors_constants_never_bind_on_the_papers_ranges():
    """The audit: with L1 = 1/s and L2 = 1.2 at batch 10, T_l ≤ 7,000 and T_o needs a 1,250-token jump."""
    a = SloOdbs(SloOdbsOptions(preset="authors"))
    assert a.slo_term(350.0, 350.0, 9) == pytest.approx(7000.0) and a.threshold == 15000.0
    assert a.length_term(642.0, 0.0, 9) < a.threshold  # Alpaca's longest output from zero
    p = SloOdbs()  # calibrated: both exceed Θ inside the ranges (the SLO term from the 11th member)
    assert p.slo_term(350.0, 350.0, 10) > p.threshold and p.length_term(642.0, 0.0, 9) > p.threshold


def test_authors_preset_reproduces_the_scripts():
    a = make_batching_policy("slo_odbs", preset="authors")
    assert (a.threshold, a.max_batch, a.length_scale, a.sort_output_weight, a.slo_scale) == (
        15000.0,
        10,
        1.2,
        0.5,
        1.0,
    )
    # sort key SLO + 0.5·output: 50 s + 5 = 55 goes before 10 s + 50 = 60; the paper sorts by SLO only
    reqs = [q("tight_long", 100, 10.0), q("loose_short", 10, 50.0)]
    assert [
        b.request_ids
        for b in SloOdbs(SloOdbsOptions(preset="authors", max_batch=1)).partition(reqs, pool(), LIMITS, 0.0)
    ] == [
        ("loose_short",),
        ("tight_long",),
    ]
    assert [
        b.request_ids for b in SloOdbs(SloOdbsOptions(max_batch=1)).partition(reqs, pool(), LIMITS, 0.0)
    ] == [
        ("tight_long",),
        ("loose_short",),
    ]
    # batches of 10 whatever the SLOs and lengths on the paper's ranges (the degenerate behaviour)
    spread = [q(f"r{i:02d}", 20 + 30 * (i % 3), 1.0 + 349.0 * i / 29) for i in range(30)]
    assert sizes(a, spread) == [10, 10, 10]
    # explicit options override the preset; the variants take presets too; unknown presets are refused
    assert SloOdbs(SloOdbsOptions(preset="authors", threshold=5.0, max_batch=None)).max_batch is None
    assert (
        Odbs(SloOdbsOptions(preset="authors")).length_scale == 1.2
        and SloDbs(SloOdbsOptions(preset="paper")).slo_scale == PRESETS["paper"].slo_scale
    )
    with pytest.raises(ValueError, match="preset"):
        make_batching_policy("slo_odbs", preset="nope")
    assert make_engine_policy("slo_odbs", preset="authors", slice_end="recompute").threshold == 15000.0


# ------------------------------------------------------------------------------ both terms bind


def test_slo_term_binds_in_the_loose_half_of_the_slo_range():
    tight = [q(f"t{i}", 20, 80.0 + i * 1e-3) for i in range(20)]  # (80+80)·20·2.14 = 6,838 ≤ 15,000
    loose = [q(f"l{i}", 20, 300.0 + i * 1e-3) for i in range(20)]  # (300+300)·k·2.14 ≤ 15,000 → k ≤ 11
    assert sizes(SloDbs(), tight) == [20] and sizes(SloDbs(), loose) == [11, 9]
    assert sizes(SloDbs(SloOdbsOptions(preset="authors", max_batch=None)), loose) == [
        20
    ]  # the authors' L1 never binds
    # over the whole range (SLOs 1..350 s, equal lengths): the batches shrink as the SLOs loosen
    ramp = [q(f"r{i:03d}", 20, 1.0 + 349.0 * i / 199) for i in range(200)]
    got = sizes(SloDbs(), ramp)
    body = got[:-1]  # the last batch is the remainder
    assert body[0] > 20 and body[-1] <= 11 and body == sorted(body, reverse=True)


def test_length_term_binds_on_alpaca_scale_jumps():
    nine = [q(f"r{i}", 40, 1.0 + i * 1e-3) for i in range(9)]
    jump = q("jump", 40 + 150, 2.0)  # +150 tokens at the 10th member: 150·10·11.19 = 16,791 > 15,000
    small = q("small", 40 + 120, 2.0)  # +120 tokens: 13,433 ≤ 15,000
    assert sizes(Odbs(), [*nine, jump]) == [9, 1] and sizes(Odbs(), [*nine, small]) == [10]
    assert sizes(Odbs(SloOdbsOptions(preset="authors")), [*nine, jump]) == [10]


def test_both_terms_change_the_decision_together():
    """Neither term alone reaches Θ, their sum does: only SLO-ODBS splits."""
    nine = [q(f"r{i}", 40, 200.0 + i * 1e-3) for i in range(9)]
    tenth = q("tenth", 40 + 80, 200.01)  # T_l = 400·10·2.14 = 8,547; T_o = 80·10·11.19 = 8,955
    reqs = [*nine, tenth]
    p = SloOdbs()
    assert p.slo_term(200.01, 200.008, 9) < p.threshold and p.length_term(120.0, 40.0, 9) < p.threshold
    assert sizes(SloDbs(), reqs) == [10] and sizes(Odbs(), reqs) == [10]
    assert sizes(SloOdbs(), reqs) == [9, 1]
    # and each term moves it: a tighter SLO (T_l 4,274) or a smaller jump (T_o 4,478) lets it join
    assert sizes(SloOdbs(), [q(f"r{i}", 40, 100.0 + i * 1e-3) for i in range(9)] + [q("t", 120, 100.01)]) == [
        10
    ]
    assert sizes(SloOdbs(), [*nine, q("t", 80, 200.01)]) == [10]


# ------------------------------------------------------------------------------ CM-based batch size


def test_cm_size_shrinks_when_memory_is_short():
    p = SloOdbs()
    # rows of 16 + 48 = 64 tokens = 4 blocks: 40 blocks hold 10 rows, 20 hold 5, 3 still give 1
    assert p.cm_batch_size("m", 16, 48.0, 100.0, pool(40), LIMITS) == 10
    assert p.cm_batch_size("m", 16, 48.0, 100.0, pool(20), LIMITS) == 5
    assert p.cm_batch_size("m", 16, 48.0, 100.0, pool(3), LIMITS) == 1
    # a larger CM (longer output) shrinks it: rows of 16 + 112 = 8 blocks
    assert p.cm_batch_size("m", 16, 112.0, 100.0, pool(40), LIMITS) == 5
    # caps: max_batch and the engine's max_requests
    assert SloOdbs(SloOdbsOptions(max_batch=3)).cm_batch_size("m", 16, 48.0, 100.0, pool(), LIMITS) == 3
    assert p.cm_batch_size("m", 16, 48.0, 100.0, pool(), BatchLimits(max_requests=7)) == 7
    reqs = [q(f"r{i:02d}", 48, 10.0 + i * 1e-3) for i in range(20)]
    assert sizes(p, reqs) == [20]
    assert sizes(p, reqs, free=40) == [10, 10] and sizes(p, reqs, free=20) == [5, 5, 5, 5]


class LinearServe:
    """T_serve(n, l_in, s) = n · s · 0.1 s: each row costs 0.1 s per iteration."""

    def t_serve(self, n, l_in, s):
        return n * s * 0.1


def test_cm_size_latency_bound_from_a_typed_cost_model():
    cost = LinearServe()
    assert isinstance(cost, BatchCost)
    p = SloOdbs(SloOdbsOptions(cost=cost))
    # 10 iterations: 1 s per row; a 4.5 s SLO allows 4 rows, 100 s the memory/cap bound
    assert p.cm_batch_size("m", 16, 10.0, 4.5, pool(), LIMITS) == 4
    assert p.cm_batch_size("m", 16, 10.0, 100.0, pool(), LIMITS) == 100
    assert p.cm_batch_size("m", 16, 10.0, 0.5, pool(), LIMITS) == LIMITS.max_requests  # unmeetable: no bound
    reqs = [q(f"r{i}", 10, 4.5 + i * 1e-3) for i in range(10)]
    assert sizes(p, reqs) == [4, 4, 2] and sizes(SloOdbs(), reqs) == [10]


def test_cost_options_are_json_friendly():
    assert as_batch_cost(None) is None
    with pytest.raises(ValueError, match="t_serve"):
        SloOdbs(SloOdbsOptions(cost=object()))
    with pytest.raises(ValueError, match="model and hardware"):
        SloOdbs(SloOdbsOptions(cost={"model": "llama2-7b"}))
    t0 = time.perf_counter()
    p = make_batching_policy("slo_odbs", cost={"model": "llama2-7b", "hardware": "rtx-4090"})
    assert time.perf_counter() - t0 < 30
    one, many = p.cost.t_serve(1, 20, 67), p.cost.t_serve(32, 20, 67)
    assert 0 < one < many and math.isfinite(many)
