"""Arrival processes: rates and CVs on ~20k samples (fixed seeds), replay, piecewise and thinning."""

from __future__ import annotations

import numpy as np
import pytest
from llmfleet.workload import gamma, piecewise_poisson, poisson, replay, sinusoid_poisson, thinned_poisson
from llmfleet.workload.arrivals import replay_index
from scipy import stats

N = 20_000


def gaps_of(t: np.ndarray) -> np.ndarray:
    return np.diff(np.concatenate([[0.0], t]))


def cv_of(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


def test_poisson_rate_and_cv():
    t = poisson(5.0, n=N, seed=1)
    assert t.shape == (N,) and np.all(np.diff(t) >= 0) and t[0] > 0
    g = gaps_of(t)
    assert g.mean() == pytest.approx(0.2, rel=0.03)
    assert cv_of(g) == pytest.approx(1.0, abs=0.04)


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_rate_and_cv(cv):
    g = gaps_of(gamma(4.0, cv, n=N, seed=2))
    assert g.mean() == pytest.approx(0.25, rel=0.05)
    assert cv_of(g) == pytest.approx(cv, rel=0.07)


def test_gamma_cv1_matches_poisson_in_distribution():
    exp_gaps = gaps_of(poisson(3.0, n=N, seed=3))
    assert stats.ks_2samp(exp_gaps, gaps_of(gamma(3.0, 1.0, n=N, seed=4))).pvalue > 0.01
    # the test has power: a more regular Gamma process is told apart at once
    assert stats.ks_2samp(exp_gaps, gaps_of(gamma(3.0, 0.7, n=N, seed=4))).pvalue < 1e-6


def test_duration_mode_counts_and_bounds():
    t = poisson(5.0, duration_s=4000.0, seed=5)
    assert np.all(t < 4000.0) and np.all(np.diff(t) >= 0)
    assert t.size == pytest.approx(20_000, rel=0.03)
    g = gamma(5.0, 2.0, duration_s=4000.0, seed=5)
    assert np.all(g < 4000.0) and g.size == pytest.approx(20_000, rel=0.08)
    assert poisson(1e-6, duration_s=1.0, seed=0).size == 0


def test_seeding_is_deterministic():
    assert np.array_equal(poisson(2.0, n=100, seed=7), poisson(2.0, n=100, seed=7))
    assert not np.array_equal(poisson(2.0, n=100, seed=7), poisson(2.0, n=100, seed=8))
    assert np.array_equal(gamma(2.0, 3.0, duration_s=50.0, seed=9), gamma(2.0, 3.0, duration_s=50.0, seed=9))
    rng = np.random.default_rng(7)
    a, b = poisson(2.0, n=10, seed=rng), poisson(2.0, n=10, seed=rng)  # a Generator is advanced
    assert not np.array_equal(a, b)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: poisson(2.0, seed=0), "exactly one of n or duration_s"),
        (lambda: poisson(2.0, n=5, duration_s=1.0), "exactly one of n or duration_s"),
        (lambda: poisson(0.0, n=5), "rate_rps must be"),
        (lambda: poisson(-1.0, n=5), "rate_rps must be"),
        (lambda: poisson(float("nan"), n=5), "rate_rps must be"),
        (lambda: poisson(1.0, n=-1), "n must be"),
        (lambda: poisson(1.0, duration_s=0.0), "duration_s must be"),
        (lambda: gamma(1.0, 0.0, n=5), "cv must be"),
        (lambda: gamma(1.0, -2.0, n=5), "cv must be"),
    ],
)
def test_argument_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_seed_type_is_checked():
    with pytest.raises(TypeError, match="seed"):
        poisson(1.0, n=3, seed=1.5)  # type: ignore[arg-type]  # a wrong type on purpose: the check under test


def test_replay_window_and_scale():
    ts = [100.0, 103.0, 101.0, 110.0, 101.0]
    assert replay(ts).tolist() == [0.0, 1.0, 1.0, 3.0, 10.0]
    assert replay(ts, start_s=1.0, end_s=10.0).tolist() == [0.0, 0.0, 2.0]
    assert replay(ts, start_s=1.0, end_s=10.0, rate_scale=2.0).tolist() == [0.0, 0.0, 1.0]
    assert replay(ts, rate_scale=0.5).tolist() == [0.0, 2.0, 2.0, 6.0, 20.0]
    idx, _ = replay_index(ts, start_s=1.0)
    assert idx.tolist() == [2, 4, 1, 3]  # stable: equal times keep input order
    assert replay([]).size == 0
    with pytest.raises(ValueError, match="rate_scale"):
        replay(ts, rate_scale=0.0)
    with pytest.raises(ValueError, match="end_s must be > start_s"):
        replay(ts, start_s=5.0, end_s=5.0)
    with pytest.raises(ValueError, match="finite"):
        replay([0.0, float("nan")])


def test_piecewise_poisson_rates_by_segment():
    t = piecewise_poisson([(1000.0, 2.0), (500.0, 0.0), (1000.0, 10.0)], seed=11)
    assert np.all(np.diff(t) >= 0) and t.max() < 2500.0
    first, idle, last = (t < 1000).sum(), ((t >= 1000) & (t < 1500)).sum(), (t >= 1500).sum()
    assert first == pytest.approx(2000, rel=0.1)
    assert idle == 0
    assert last == pytest.approx(10_000, rel=0.05)
    g = np.diff(t[t >= 1500])
    assert cv_of(g) == pytest.approx(1.0, abs=0.06)  # Poisson within a segment
    assert np.array_equal(t, piecewise_poisson([(1000.0, 2.0), (500.0, 0.0), (1000.0, 10.0)], seed=11))


@pytest.mark.parametrize(
    ("segments", "match"),
    [
        ([], "must not be empty"),
        ([(10.0, -1.0)], "segment 0: rate_rps"),
        ([(10.0, 1.0), (0.0, 1.0)], "segment 1: duration_s"),
        ([(10.0,)], r"segment 0: expected \(duration_s, rate_rps\)"),
    ],
)
def test_piecewise_validation(segments, match):
    with pytest.raises(ValueError, match=match):
        piecewise_poisson(segments)


def test_sinusoid_by_thinning():
    mean, a, period = 10.0, 0.8, 100.0
    t = sinusoid_poisson(mean, a, period, 2000.0, seed=12)
    assert t.size == pytest.approx(mean * 2000, rel=0.03)
    rising = ((t % period) < period / 2).sum()  # sin > 0 in the first half period
    # expected halves: mean * P/2 * (1 ± 2a/π) per period, over 20 periods
    assert rising == pytest.approx(20 * mean * period / 2 * (1 + 2 * a / np.pi), rel=0.03)
    assert t.size - rising == pytest.approx(20 * mean * period / 2 * (1 - 2 * a / np.pi), rel=0.05)
    with pytest.raises(ValueError, match="amplitude"):
        sinusoid_poisson(1.0, 1.5, 10.0, 10.0)


def test_thinning_rejects_rates_above_max():
    with pytest.raises(ValueError, match="rate_max"):
        thinned_poisson(lambda t: np.full_like(t, 5.0), 2.0, 100.0)
    flat = thinned_poisson(lambda t: np.full_like(t, 2.0), 4.0, 5000.0, seed=1)
    assert flat.size == pytest.approx(10_000, rel=0.04)
