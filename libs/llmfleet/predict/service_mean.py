"""Per-service running mean and standard deviation of output length (SeaLLM, §4: L̂_s and σ_s).

Welford's online update keeps mean and variance exact in one pass and numerically stable. Before a
service has any observation the predictor answers with a configurable prior (mean, std).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmfleet.predict.base import LengthQuery, Prediction
from llmfleet.welford import RunningStats


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
