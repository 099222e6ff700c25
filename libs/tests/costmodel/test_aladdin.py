"""Aladdin forms: fits recover known coefficients, the decode context limit, TP and KV."""

import numpy as np
import pytest
from llmfleet.costmodel import DecodeModel, FitError, fit_decode, fit_kv, fit_prefill, fit_tp

RNG = np.random.default_rng(7)


def noisy(x: float, rel: float = 0.005) -> float:
    return float(x * (1 + RNG.normal(0, rel)))


def test_fit_prefill_recovers_coefficients():
    k1, c1 = 1.2e-4, 0.015
    samples = [(t, noisy(k1 * t + c1)) for t in range(64, 8192, 256)]
    model, rep = fit_prefill(samples)
    assert model.k1 == pytest.approx(k1, rel=0.03)
    assert model.c1 == pytest.approx(c1, rel=0.2)
    assert rep.max_rel_error < 0.03 and rep.n_points == len(samples)
    assert rep.params == {"k1": model.k1, "c1": model.c1}


def test_fit_decode_recovers_coefficients():
    k2, c2, c3 = 2e-7, 1.5e-4, 0.012
    samples = [
        (b, lav, noisy((k2 * lav + c2) * b + c3)) for b in (1, 2, 4, 8, 16, 32) for lav in (128, 512, 2048)
    ]
    model, rep = fit_decode(samples)
    assert model.k2 == pytest.approx(k2, rel=0.05)
    assert model.c2 == pytest.approx(c2, rel=0.1)
    assert model.c3 == pytest.approx(c3, rel=0.05)
    assert rep.max_rel_error < 0.03


def test_context_limit_formula_and_clamp():
    m = DecodeModel(k2=2e-7, c2=1.5e-4, c3=0.012)
    b, t_dec = 8, 0.03
    limit = m.context_limit(b, t_dec)
    assert limit == pytest.approx((t_dec - 0.012 - 1.5e-4 * b) / 2e-7)
    # the batch at that total context (l_ave = limit / b) decodes in exactly T_dec
    assert m.predict(b, limit / b) == pytest.approx(t_dec)
    assert m.context_limit(16, t_dec) < limit  # shrinks as b grows
    assert m.context_limit(1000, t_dec) == 0.0
    assert DecodeModel(0.0, 1e-4, 0.01).context_limit(1, 0.02) == float("inf")


def test_fit_kv_exact():
    h, j = 131072.0, 4096.0
    model, rep = fit_kv([(n, h * n + j) for n in (10, 100, 1000, 5000)])
    assert model.h == pytest.approx(h) and model.j == pytest.approx(j)
    assert rep.max_rel_error < 1e-9


def test_fit_tp_recovers_coefficients():
    k4, c4, kc = 0.08, 0.004, 0.006
    samples = [(n, noisy(k4 / n + c4), noisy(kc * (n - 1) / n) if n > 1 else 0.0) for n in (1, 2, 4, 8)]
    model, rep = fit_tp(samples)
    assert model.k4 == pytest.approx(k4, rel=0.05)
    assert model.c4 == pytest.approx(c4, rel=0.3)
    assert model.k_comm == pytest.approx(kc, rel=0.05)
    assert model.predict(1) == pytest.approx(model.compute(1))
    assert rep.n_points == 4


@pytest.mark.parametrize(
    ("fit", "samples"),
    [
        (fit_prefill, [(100, 0.01)]),
        (fit_prefill, [(100, 0.01), (100, 0.011), (100, 0.012)]),  # all x equal
        (fit_decode, [(1, 100, 0.01), (2, 100, 0.02)]),  # too few
        (fit_decode, [(4, 100, 0.01), (4, 200, 0.02), (4, 400, 0.03)]),  # one batch size: b·l ∝ l, b ∝ 1
        (fit_kv, []),
        (fit_tp, [(1, 0.1, 0.0)]),
        (fit_prefill, [(100, float("nan")), (200, 0.02)]),
    ],
)
def test_fit_errors_instead_of_nan(fit, samples):
    with pytest.raises(FitError):
        fit(samples)


def bent_prefill() -> list[tuple[float, float]]:
    """Sub-linear at small sizes (a fixed cost that grows with the first few hundred tokens), as on
    CPUs: no straight line fits every point, so the loss decides where the error goes."""
    return [
        (t, 2e-4 + 1e-6 * t + 3e-4 * (1 - np.exp(-t / 200))) for t in (16, 32, 64, 128, 256, 512, 1024, 2048)
    ]


def test_relative_fit_lowers_the_worst_relative_error():
    plain_model, plain = fit_prefill(bent_prefill())
    rel_model, rel = fit_prefill(bent_prefill(), relative=True)
    assert rel.max_rel_error < 0.5 * plain.max_rel_error
    assert rel.rmse_s > plain.rmse_s  # the price: more absolute error on the long points

    # it is the minimum of Σ((ŷ − y)/y)²: nudging either coefficient makes that sum larger
    def rel_sse(k1: float, c1: float) -> float:
        return sum(((k1 * t + c1 - y) / y) ** 2 for t, y in bent_prefill())

    best = rel_sse(rel_model.k1, rel_model.c1)
    for dk, dc in ((1.01, 1), (0.99, 1), (1, 1.01), (1, 0.99)):
        assert rel_sse(rel_model.k1 * dk, rel_model.c1 * dc) > best
    assert rel_sse(plain_model.k1, plain_model.c1) > best


def test_relative_fit_recovers_exact_coefficients_and_needs_positive_times():
    k2, c2, c3 = 2e-7, 1.5e-4, 0.012
    samples = [(b, lav, (k2 * lav + c2) * b + c3) for b in (1, 2, 4, 8) for lav in (128, 512, 2048)]
    model, rep = fit_decode(samples, relative=True)
    assert model.k2 == pytest.approx(k2, rel=1e-6) and model.c3 == pytest.approx(c3, rel=1e-6)
    assert rep.max_rel_error < 1e-9
    with pytest.raises(FitError, match="> 0"):
        fit_prefill([(100, 0.01), (200, 0.0), (300, 0.03)], relative=True)
