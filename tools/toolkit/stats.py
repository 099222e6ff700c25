"""Percentiles and spreads of measurements, as the tools' reports show them."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def pct(xs: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (inclusive quantiles), rounded to 4 digits; None when ``xs`` is empty."""
    if not xs:
        return None
    if len(xs) == 1:
        return round(xs[0], 4)
    return round(statistics.quantiles(sorted(xs), n=100, method="inclusive")[int(p) - 1], 4)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile, linearly interpolated between the closest ranks; NaN when empty."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements (callers add ``n`` or the values themselves)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ms(seconds: float | None) -> float | None:
    """Seconds as milliseconds rounded to 0.1 (None stays None)."""
    return None if seconds is None else round(1000 * seconds, 1)
