"""Per-service, time-varying, bursty arrivals (``piecewise_gamma``, ``per_service_arrivals``)."""

from __future__ import annotations

import numpy as np
import pytest
from llmfleet.workload import per_service_arrivals, piecewise_gamma


def test_piecewise_gamma_rate_per_segment_and_burstiness():
    t = piecewise_gamma([(200.0, 5.0), (100.0, 0.0), (200.0, 20.0)], cv=2.0, seed=3)
    assert np.all(np.diff(t) >= 0)
    first, idle, last = (t < 200).sum(), ((t >= 200) & (t < 300)).sum(), (t >= 300).sum()
    assert idle == 0 and t.max() < 500.0
    assert first == pytest.approx(1000, rel=0.2) and last == pytest.approx(4000, rel=0.15)
    gaps = np.diff(t[t >= 300])
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.2)
    assert np.array_equal(t, piecewise_gamma([(200.0, 5.0), (100.0, 0.0), (200.0, 20.0)], cv=2.0, seed=3))


def test_piecewise_gamma_bad_input():
    with pytest.raises(ValueError, match="empty"):
        piecewise_gamma([])
    with pytest.raises(ValueError, match="segment 0"):
        piecewise_gamma([(0.0, 1.0)])
    with pytest.raises(ValueError, match="cv"):
        piecewise_gamma([(1.0, 1.0)], cv=0.0)


def test_per_service_arrivals_each_service_its_own_process():
    arr = per_service_arrivals(
        {"a": 10.0, "b": [(50.0, 2.0), (50.0, 30.0)]}, 100.0, cv={"a": 1.0, "b": 3.0}, seed=1
    )
    assert set(arr) == {"a", "b"}
    assert arr["a"].size == pytest.approx(1000, rel=0.15) and arr["a"].max() < 100.0
    b = arr["b"]
    assert (b < 50).sum() == pytest.approx(100, rel=0.5) and (b >= 50).sum() == pytest.approx(1500, rel=0.2)
    again = per_service_arrivals(
        {"a": 10.0, "b": [(50.0, 2.0), (50.0, 30.0)]}, 100.0, cv={"a": 1.0, "b": 3.0}, seed=1
    )
    assert all(np.array_equal(arr[k], again[k]) for k in arr)
    # a service's stream depends on its position, not on the others' rates
    other = per_service_arrivals({"a": 10.0, "b": 1.0}, 100.0, seed=1)
    assert np.array_equal(other["a"], arr["a"])
    with pytest.raises(ValueError, match="'a'"):
        per_service_arrivals({"a": -1.0}, 10.0)
