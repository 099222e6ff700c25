"""Per-service running mean and standard deviation of output length (SeaLLM, §4: L̂_s and σ_s).

Welford's online update keeps mean and variance exact in one pass and numerically stable. Before a
service has any observation the predictor answers with a configurable prior (mean, std).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llmfleet.predict.base import LengthQuery, Prediction


@dataclass
class RunningStats:
    """Welford accumulator: count, mean and M2 (sum of squared deviations)."""

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


@dataclass
class ServiceMeanPredictor:
    """Predicts each service's running mean output length; ``observe`` feeds completed requests."""

    prior_mean: float = 64.0
    prior_std: float = 32.0
    name: str = "service_mean"
    stats: dict[str, RunningStats] = field(default_factory=dict)

    def predict(self, query: LengthQuery) -> Prediction:
        s = self.stats.get(query.service)
        if s is None or s.count == 0:
            return Prediction(self.prior_mean, self.prior_std, 0, self.name)
        return Prediction(s.mean, s.std, s.count, self.name)

    def observe(self, query: LengthQuery, output_tokens: int) -> None:
        if output_tokens < 0:
            raise ValueError(f"output_tokens must be >= 0, got {output_tokens}")
        self.stats.setdefault(query.service, RunningStats()).add(float(output_tokens))
