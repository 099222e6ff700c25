"""Per-iteration overhead fitted on Vidur's CPU-overhead rows (``costmodel.overhead``)."""

from __future__ import annotations

import pytest
from llmfleet.costmodel.overhead import IterationOverhead, constant_overhead, fit_overhead


def test_fit_recovers_a_line_per_tp():
    rows = [("m", 1, ((8, 1.8), (16, 2.6), (32, 4.2))), ("n", 2, ((8, 7.0), (64, 9.8)))]
    o = fit_overhead(rows, source="hand")
    assert o.fits[1] == pytest.approx((1.0e-3, 0.1e-3))
    assert o(16, 1) == pytest.approx(2.6e-3)
    assert o(8, 2) == pytest.approx(7.0e-3) and o.max_rel_error < 1e-9
    assert o.coefficients(4) == o.fits[2]  # nearest measured TP


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="TP 1: need at least two distinct batch sizes"):
        fit_overhead([("m", 1, ((8, 1.0), (8, 1.1)))])
    with pytest.raises(ValueError, match="must be > 0 ms"):
        fit_overhead([("m", 1, ((8, 0.0), (16, 1.0)))])
    with pytest.raises(ValueError, match="bad overhead fit for TP 0"):
        IterationOverhead({0: (1e-3, 0.0)})
    with pytest.raises(ValueError, match="tensor-parallel degree"):
        constant_overhead(2e-3)(1, 0)
    assert constant_overhead(2e-3)(64, 8) == pytest.approx(2e-3)
