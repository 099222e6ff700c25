"""Aladdin's worker-count rule (§5.2, Eq. 7): N_w = ⌈k5·r_a + c5⌉ for arrival rates r_a > R.

k5 and c5 are fitted by ordinary least squares on (rate, workers needed) pairs, e.g. from replaying
best-fit placement offline at several rates; only pairs with rate > R (``min_rate``) enter the fit.
Resolutions: below R the linear law does not hold (too few requests per heartbeat to represent the
length distribution), so ``workers`` answers with the count at R (conservative); the answer is never
below ``min_workers``. ⌈·⌉ ignores a 1e-9 excess so that an exact integer is not rounded up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class AladdinLinearScaler:
    """N_w = max(min_workers, ⌈k5·max(r_a, R) + c5⌉)."""

    name = "aladdin_linear"

    def __init__(
        self, k5: float | None = None, c5: float = 0.0, min_rate: float = 0.0, min_workers: int = 1
    ) -> None:
        if min_workers < 0 or min_rate < 0:
            raise ValueError("min_rate and min_workers must be >= 0")
        self.k5 = k5
        self.c5 = float(c5)
        self.min_rate = float(min_rate)
        self.min_workers = int(min_workers)

    def fit(self, rates: Sequence[float], workers: Sequence[float]) -> AladdinLinearScaler:
        """Least-squares k5, c5 over the pairs with rate > R; returns self."""
        r = np.asarray(rates, dtype=float)
        w = np.asarray(workers, dtype=float)
        if r.shape != w.shape or r.ndim != 1:
            raise ValueError("rates and workers must be 1-D sequences of the same length")
        keep = r > self.min_rate
        if np.unique(r[keep]).size < 2:
            raise ValueError(f"need at least two distinct rates above R={self.min_rate} to fit")
        design = np.column_stack([r[keep], np.ones(int(keep.sum()))])
        (k5, c5), *_ = np.linalg.lstsq(design, w[keep], rcond=None)
        self.k5, self.c5 = float(k5), float(c5)
        return self

    def workers(self, rate: float) -> int:
        if self.k5 is None:
            raise ValueError("AladdinLinearScaler has no k5: pass it or call fit() first")
        x = self.k5 * max(float(rate), self.min_rate) + self.c5
        return max(self.min_workers, math.ceil(x - 1e-9))
