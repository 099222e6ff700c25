"""Welford's online mean and variance: one pass, numerically stable (pure; used by predictors and policies)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class RunningStats:
    """Running count, mean and M2 (sum of squared deviations from the mean) of one series."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.count += 1
        delta = x - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (x - self.mean)

    @property
    def std(self) -> float:
        """Population standard deviation (0 with fewer than two samples)."""
        return math.sqrt(self.m2 / self.count) if self.count > 1 else 0.0

    @property
    def sample_std(self) -> float:
        """Sample standard deviation (n − 1); 0 with fewer than two samples."""
        return math.sqrt(self.m2 / (self.count - 1)) if self.count >= 2 else 0.0
