"""The service monitor's output types: per-window statistics of one service, and their summaries."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from llmfleet.monitor.records import RequestSample


@dataclass(frozen=True)
class LengthStats:
    """Count, mean and M2 (Welford) of a length series; summaries of disjoint series merge exactly."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @property
    def std(self) -> float:
        """Population standard deviation (0 with fewer than two values)."""
        return math.sqrt(self.m2 / self.count) if self.count > 1 else 0.0

    @classmethod
    def of(cls, values: Iterable[float] | np.ndarray) -> LengthStats:
        """Two passes over the values (as stable as Welford's one pass, at numpy speed)."""
        a = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
        if a.size == 0:
            return cls()
        mean = float(a.mean())
        return cls(int(a.size), mean, float(((a - mean) ** 2).sum()))

    @classmethod
    def merge(cls, parts: Iterable[LengthStats]) -> LengthStats:
        """Chan et al.'s pairwise combination of Welford summaries."""
        n, mean, m2 = 0, 0.0, 0.0
        for p in parts:
            if p.count == 0:
                continue
            total = n + p.count
            delta = p.mean - mean
            mean += delta * p.count / total
            m2 += p.m2 + delta * delta * n * p.count / total
            n = total
        return cls(n, mean, m2)


PCTS = (50, 90, 99)


@dataclass(frozen=True)
class Distribution:
    """Count, mean and p50/p90/p99 (linear interpolation) of a latency series; zeros when empty."""

    count: int = 0
    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if len(values) == 0:
            return cls()
        a = np.asarray(values, dtype=float)
        p50, p90, p99 = (float(x) for x in np.percentile(a, PCTS))
        return cls(int(a.size), float(a.mean()), p50, p90, p99)


@dataclass(frozen=True)
class WindowStats:
    """One service over the sliding window of the last ``window_s`` seconds.

    ``span_s`` is the observed part of the window (shorter while the reporter has run less than
    ``window_s``); ``rate_rps`` = arrivals / span_s (merged reports add their rates). Lengths and
    latency distributions cover completed requests; the SLO counters cover finished ones
    (completed + failed, a failed request misses). See :mod:`llmfleet.monitor.window` for the SLO and
    normalized-latency definitions.
    """

    window_s: float
    span_s: float = 0.0
    arrivals: int = 0
    rate_rps: float = 0.0
    completed: int = 0
    failed: int = 0
    prompt_tokens: LengthStats = field(default_factory=LengthStats)
    output_tokens: LengthStats = field(default_factory=LengthStats)
    ttft_s: Distribution = field(default_factory=Distribution)
    tpot_s: Distribution = field(default_factory=Distribution)
    latency_s: Distribution = field(default_factory=Distribution)
    slo_met: int = 0  # every objective of the service's Slo
    latency_met: int = 0  # SeaLLM's: latency <= latency_scale x solo time
    ttft_tpot_met: int = 0  # Aladdin's: ttft <= ttft_s and tpot <= tpot_s (where set)
    normalized_sum: float = 0.0  # Σ latency / L̂_s over completed requests with a solo estimate
    normalized_count: int = 0

    @property
    def finished(self) -> int:
        return self.completed + self.failed

    @property
    def attainment(self) -> float | None:
        """Fraction of finished requests meeting the whole SLO; None when none finished."""
        return self.slo_met / self.finished if self.finished else None

    @property
    def latency_attainment(self) -> float | None:
        return self.latency_met / self.finished if self.finished else None

    @property
    def ttft_tpot_attainment(self) -> float | None:
        return self.ttft_tpot_met / self.finished if self.finished else None

    @property
    def normalized_latency(self) -> float | None:
        """Mean L_r / L̂_s; None without a completed request that has a solo-time estimate."""
        return self.normalized_sum / self.normalized_count if self.normalized_count else None


@dataclass(frozen=True)
class ServiceStats:
    """One service's statistics over each configured window (ascending), plus the recent workload.

    ``samples`` are the most recent arrivals among completed requests (ascending arrival), at most
    the holder's bound; ``samples_complete`` says they hold every completed request of the longest
    window (the bound was not reached), so their arrival times are the window's whole arrival process.
    """

    service: str
    model: str = ""
    windows: tuple[WindowStats, ...] = ()
    samples: tuple[RequestSample, ...] = ()
    samples_complete: bool = True
    # requests the reporter's dispatch found no feasible worker for, since it started (cumulative)
    infeasible: int = 0
    # right now (not windowed): requests not started yet, held in the scheduler or queued on engines,
    # and of them those held because no engine hosts the model (cold: scale from zero)
    queued: int = 0
    cold: int = 0
    held: int = 0  # of the queued, those the scheduler holds (cold, or every engine saturated)

    def window(self, window_s: float | None = None) -> WindowStats:
        """The window of ``window_s`` seconds (else the shortest one at least that long, else the
        longest); the middle one when ``window_s`` is None; an empty window when there is none."""
        if not self.windows:
            return WindowStats(window_s or 0.0)
        if window_s is None:
            return self.windows[len(self.windows) // 2]
        longer = [w for w in self.windows if w.window_s >= window_s - 1e-9]
        return min(longer, key=lambda w: w.window_s) if longer else self.windows[-1]
