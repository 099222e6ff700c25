"""The predictor interface: pure objects, no I/O, usable by the profiler service and the simulator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

QUANTILE_LEVELS: tuple[float, ...] = (0.5, 0.9, 0.99)
"""Levels of ``Prediction.quantiles`` for predictors that report quantiles (in this order)."""


@dataclass(frozen=True)
class LengthQuery:
    """What a predictor may look at for one request.

    ``generated_tokens`` > 0 asks for a re-prediction: the request has already produced that many
    output tokens, so its final length is known to exceed it (Aladdin: E[l_out | l_in, l_out > l_now]).
    """

    service: str
    prompt: str = ""
    prompt_tokens: int = 0
    generated_tokens: int = 0


@dataclass(frozen=True)
class Prediction:
    """Expected output length in tokens, its spread, and how many observations it rests on.

    Optional detail (empty when a predictor has none):
    ``quantiles`` — output-length quantiles at ``QUANTILE_LEVELS``;
    ``bucket_probs`` — a classifier's probability per bucket; ``buckets`` — those buckets' upper edges
    (exclusive, tokens; the last one is the cap used for the open-ended top bucket).
    """

    mean: float
    std: float
    observations: int
    predictor: str
    quantiles: tuple[float, ...] = ()
    bucket_probs: tuple[float, ...] = ()
    buckets: tuple[int, ...] = ()


class LengthPredictor(Protocol):
    name: str

    def predict(self, query: LengthQuery) -> Prediction: ...

    def observe(self, query: LengthQuery, output_tokens: int) -> None: ...
