"""SCLS: T_serve closed form against the explicit sum, N_max, and curve_fit recovery."""

import numpy as np
import pytest
from llmfleet.costmodel import (
    FitError,
    SclsDecode,
    SclsModel,
    SclsPrefill,
    fit_scls_decode,
    fit_scls_prefill,
    n_max,
)

PRE = SclsPrefill(p1=2e-5, p2=3e-3, p3=1e-5, p4=0.02)
DEC = SclsDecode(d1=1e-7, d2=2e-4, d3=3e-7, d4=0.015)


@pytest.mark.parametrize(("n", "l_in", "s"), [(1, 1, 1), (4, 100, 128), (16, 1024, 128), (7, 33, 5)])
def test_t_serve_closed_form_equals_sum(n, l_in, s):
    m = SclsModel(PRE, DEC)
    assert m.t_serve(n, l_in, s) == pytest.approx(m.t_serve_sum(n, l_in, s), rel=1e-12)


def test_n_max():
    gib = 1 << 30
    # ζ·(80 − 14 − 2) GiB / (Δ·(L_i + S)) with Δ = 0.5 MiB, L_i + S = 1024 + 128
    expect = int(0.9 * 64 * gib // (524288 * 1152))
    assert n_max(80 * gib, 14 * gib, 2 * gib, 1024, 128, 524288) == expect
    assert n_max(10, 20, 0, 10, 10, 1.0) == 0
    with pytest.raises(ValueError):
        n_max(10, 0, 0, 10, 10, 0.0)


def test_fits_recover_coefficients():
    rng = np.random.default_rng(3)
    grid = [(n, ln) for n in (1, 2, 4, 8, 16) for ln in (64, 256, 512, 1024)]
    pre = [(n, ln, PRE.predict(n, ln) * (1 + rng.normal(0, 0.003))) for n, ln in grid]
    dec = [(n, ln, DEC.predict(n, ln) * (1 + rng.normal(0, 0.003))) for n, ln in grid]
    p, rp = fit_scls_prefill(pre)
    d, rd = fit_scls_decode(dec)
    assert p.p1 == pytest.approx(PRE.p1, rel=0.05)
    assert p.p4 == pytest.approx(PRE.p4, rel=0.2)
    assert d.d1 == pytest.approx(DEC.d1, rel=0.1)
    assert d.d4 == pytest.approx(DEC.d4, rel=0.05)
    assert rp.max_rel_error < 0.02 and rd.max_rel_error < 0.02


def test_fit_too_few_or_degenerate():
    with pytest.raises(FitError, match="4 coefficients"):
        fit_scls_prefill([(1, 10, 0.1), (2, 20, 0.2), (3, 30, 0.3)])
    with pytest.raises(FitError, match="degenerate"):
        fit_scls_decode([(4, ln, 0.01 * ln) for ln in (10, 20, 30, 40, 50)])  # one N


def test_relative_curve_fit_lowers_the_worst_relative_error():
    # prefill with a per-sequence cost that saturates: not in the form, so the loss matters
    pts = [
        (n, ln, 1e-4 + 2e-7 * n * ln + 2e-4 * n * (1 - np.exp(-ln / 64)))
        for n in (1, 2, 4, 8)
        for ln in (16, 64, 256)
    ]
    _, plain = fit_scls_prefill(pts)
    _, rel = fit_scls_prefill(pts, relative=True)
    assert rel.max_rel_error < plain.max_rel_error
