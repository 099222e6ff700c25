"""A request's execution time alone (SeaLLM's "execution time"), the basis of the latency SLO and of
normalized latency.

The simulator knows it from the cost model. Live, nobody does, so the default estimate is the
service's *floor model*, fitted on the requests completed in the monitor's longest window:

    solo(r) = ttft_floor + (output_tokens_r − 1) × tpot_floor

with ``ttft_floor`` the fastest first token and ``tpot_floor`` the fastest decode step (TPOT of
requests with at least two output tokens) seen in that window: how fast the service has been served
when it met the least contention, i.e. close to alone. It ignores the prompt length's share of the
prefill (small next to decoding for chat-sized prompts) and, under sustained load with no quiet
moment in the window, it overestimates the solo time (so it errs towards reporting SLOs as met).
Where a better estimate exists (a fitted cost model on known hardware), pass a :data:`SoloTime`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llmfleet.monitor.records import Completion

# Estimate of a completed request's execution time alone, in seconds (<= 0: no estimate).
SoloTime = Callable[[Completion], float]


@dataclass(frozen=True)
class FloorSolo:
    """``solo(r) = ttft_s + (output_tokens − 1) × tpot_s`` (see the module docstring)."""

    ttft_s: float = 0.0
    tpot_s: float = 0.0

    @classmethod
    def fit(cls, ttft_s: np.ndarray, tpot_s: np.ndarray, output_tokens: np.ndarray) -> FloorSolo:
        """Floors over completed requests (arrays of equal length; empty → no estimate)."""
        if ttft_s.size == 0:
            return cls()
        multi = tpot_s[output_tokens > 1]
        return cls(float(ttft_s.min()), float(multi.min()) if multi.size else 0.0)

    def estimate(self, output_tokens: np.ndarray) -> np.ndarray:
        """Solo times for these output lengths (zeros when the floors are unknown)."""
        if self.ttft_s <= 0 and self.tpot_s <= 0:
            return np.zeros(output_tokens.shape)
        return self.ttft_s + np.maximum(output_tokens - 1, 0) * self.tpot_s

    def __call__(self, c: Completion) -> float:
        return float(self.estimate(np.asarray([c.output_tokens]))[0])
