"""Per-service execution-time statistics for SeaLLM's DB scheduling: L̂_s (mean) and σ_s (std).

RunningStats's online algorithm, one accumulator per service. Before a service has two observations its σ
is the prior ``default_std_s``; before any, its mean is the prior ``default_mean_s``. The engine may
seed a service (e.g. from the profiler's measurements) with :meth:`ServiceStats.observe`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llmfleet.welford import RunningStats


@dataclass
class ServiceStats:
    """L̂_s and σ_s of request execution time (seconds) per service, with a prior for unseen services."""

    default_mean_s: float = 1.0
    default_std_s: float = 0.5
    _acc: dict[str, RunningStats] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.default_mean_s) and self.default_mean_s > 0):
            raise ValueError(f"default_mean_s must be finite and > 0, got {self.default_mean_s!r}")
        if not (math.isfinite(self.default_std_s) and self.default_std_s >= 0):
            raise ValueError(f"default_std_s must be finite and >= 0, got {self.default_std_s!r}")

    def observe(self, service: str, exec_time_s: float) -> None:
        """Add one request's execution time (seconds, finite, >= 0) to ``service``'s statistics."""
        if not (math.isfinite(exec_time_s) and exec_time_s >= 0):
            raise ValueError(f"execution time must be finite and >= 0, got {exec_time_s!r}")
        self._acc.setdefault(service, RunningStats()).add(exec_time_s)

    def count(self, service: str) -> int:
        acc = self._acc.get(service)
        return acc.count if acc else 0

    def mean(self, service: str) -> float:
        """L̂_s: the running mean, or the prior before any observation."""
        acc = self._acc.get(service)
        return acc.mean if acc and acc.count else self.default_mean_s

    def std(self, service: str) -> float:
        """σ_s: the running sample std from two observations on, the prior before."""
        acc = self._acc.get(service)
        return acc.sample_std if acc and acc.count >= 2 else self.default_std_s

    def services(self) -> list[str]:
        """Services with at least one observation, sorted."""
        return sorted(self._acc)
