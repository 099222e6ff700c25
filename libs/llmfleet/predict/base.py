"""The predictor interface: pure objects, no I/O, usable by the profiler service and the simulator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class LengthQuery:
    """What a predictor may look at for one request."""

    service: str
    prompt: str = ""
    prompt_tokens: int = 0


@dataclass(frozen=True)
class Prediction:
    """Expected output length in tokens, its spread, and how many observations it rests on."""

    mean: float
    std: float
    observations: int
    predictor: str


class LengthPredictor(Protocol):
    name: str

    def predict(self, query: LengthQuery) -> Prediction: ...

    def observe(self, query: LengthQuery, output_tokens: int) -> None: ...
