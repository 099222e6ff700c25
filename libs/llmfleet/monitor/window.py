"""One service's sliding windows: arrivals, completions and a bounded sample of the recent workload.

Definitions (every window ends at ``now``; times are the recorder's clock):

- **arrival rate** = arrivals in the window / its observed span (``min(window, now − monitor start)``,
  at least ``min(window, 1 s)``). Arrivals are counted in buckets of ``min(windows) / 20`` seconds.
- **lengths** (prompt, output): count, mean and std of the requests completed in the window.
- **TTFT / TPOT / latency**: mean, p50, p90, p99 of the completed requests.
- **SLO attainment** (``slo_met``): a finished request meets the service's :class:`~llmfleet.types.Slo`
  when it completed (a failed request misses) and ttft ≤ ``ttft_s``, tpot ≤ ``tpot_s``, latency ≤
  ``deadline_s`` (each where set) and latency ≤ ``latency_scale`` × its solo time when there is a
  solo estimate (:mod:`llmfleet.monitor.solo`). ``latency_met`` counts SeaLLM's rule alone,
  ``ttft_tpot_met`` Aladdin's alone. Cancelled requests are not recorded as finished.
- **normalized latency**: mean over completed requests of L_r / L̂_s, with L̂_s the mean solo time of
  the window's completed requests (SeaLLM: the service's mean execution time).

Memory is bounded: at most ``max_events`` completions (the oldest go first; the longest window then
covers only the most recent ones), one counter per arrival bucket, ``max_samples`` samples.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from llmfleet.monitor.records import Completion, RequestSample
from llmfleet.monitor.solo import FloorSolo, SoloTime
from llmfleet.monitor.stats import Distribution, LengthStats, ServiceStats, WindowStats
from llmfleet.types import Slo

DEFAULT_WINDOWS_S: tuple[float, ...] = (10.0, 60.0, 300.0)
DEFAULT_MAX_SAMPLES = 512
DEFAULT_MAX_EVENTS = 20_000


def check_windows(windows_s: tuple[float, ...]) -> tuple[float, ...]:
    """Sorted, positive, finite, distinct windows (ValueError otherwise)."""
    ws = tuple(sorted(float(w) for w in windows_s))
    if not ws or any(not math.isfinite(w) or w <= 0 for w in ws) or len(set(ws)) != len(ws):
        raise ValueError(f"windows must be distinct positive seconds, got {windows_s!r}")
    return ws


@dataclass
class ServiceWindow:
    """Events of one service over the longest window; :meth:`stats` summarizes every window."""

    service: str
    model: str = ""
    windows_s: tuple[float, ...] = DEFAULT_WINDOWS_S
    max_samples: int = DEFAULT_MAX_SAMPLES
    max_events: int = DEFAULT_MAX_EVENTS
    last_event_s: float = -math.inf
    _arrivals: deque[list[int]] = field(default_factory=deque)  # [bucket index, count], ascending
    _done: deque[Completion] = field(default_factory=deque)  # in recording (≈ finish) order
    _samples: list[RequestSample] = field(default_factory=list)  # ascending arrival
    _evicted_arrival_s: float = -math.inf  # latest arrival of a sample dropped for the bound

    def __post_init__(self) -> None:
        self.windows_s = check_windows(self.windows_s)
        if self.max_samples < 0 or self.max_events < 1:
            raise ValueError("max_samples must be >= 0 and max_events >= 1")

    @property
    def horizon_s(self) -> float:
        return self.windows_s[-1]

    @property
    def bucket_s(self) -> float:
        return self.windows_s[0] / 20

    def arrive(self, t: float) -> None:
        b = math.floor(t / self.bucket_s)
        if self._arrivals and self._arrivals[-1][0] >= b:
            self._arrivals[-1][1] += 1  # same bucket (or a slightly late clock read)
        else:
            self._arrivals.append([b, 1])
        self._seen(t)

    def complete(self, c: Completion) -> None:
        if c.model:
            self.model = c.model
        self._done.append(c)
        if len(self._done) > self.max_events:
            self._done.popleft()
        if c.ok and self.max_samples:
            bisect.insort(self._samples, RequestSample(c.arrival_s, c.prompt_tokens, c.output_tokens),
                          key=lambda s: s.arrival_s)  # fmt: skip
            if len(self._samples) > self.max_samples:
                self._evicted_arrival_s = max(self._evicted_arrival_s, self._samples.pop(0).arrival_s)
        self._seen(c.finish_s)

    def _seen(self, t: float) -> None:
        self.last_event_s = max(self.last_event_s, t)
        self.prune(t)

    def prune(self, now: float) -> None:
        """Drop what is older than the longest window."""
        lo = now - self.horizon_s
        while self._arrivals and (self._arrivals[0][0] + 1) * self.bucket_s <= lo:
            self._arrivals.popleft()
        while self._done and self._done[0].finish_s <= lo:
            self._done.popleft()
        while self._samples and self._samples[0].arrival_s <= lo:
            self._samples.pop(0)

    @property
    def empty(self) -> bool:
        return not self._arrivals and not self._done

    def stats(
        self, now: float, slo: Slo | None = None, start_s: float | None = None, solo: SoloTime | None = None
    ) -> ServiceStats:
        """Every window ending at ``now``; ``start_s``: when the monitor started (the observed span)."""
        self.prune(now)
        done = sorted((c for c in self._done if c.finish_s <= now), key=lambda c: c.finish_s)
        cols = _columns(done, slo or Slo(), solo)
        finishes = [c.finish_s for c in done]
        windows = []
        for w in self.windows_s:
            lo = now - w
            observed = w if start_s is None else min(w, max(now - start_s, 0.0))
            span = max(observed, min(w, 1.0))
            arrivals = sum(n for b, n in self._arrivals if (b + 1) * self.bucket_s > lo)
            i = bisect.bisect_right(finishes, lo)
            windows.append(_window(w, span, arrivals, {k: v[i:] for k, v in cols.items()}))
        complete = self._evicted_arrival_s <= now - self.horizon_s
        return ServiceStats(self.service, self.model, tuple(windows), tuple(self._samples), complete)


def _columns(done: list[Completion], slo: Slo, solo: SoloTime | None) -> dict[str, np.ndarray]:
    """Per-request arrays (in finish order) with each request's SLO verdicts and solo time."""
    ok = np.fromiter((c.ok for c in done), bool, len(done))
    ttft = np.fromiter((c.ttft_s for c in done), float, len(done))
    tpot = np.fromiter((c.tpot_s for c in done), float, len(done))
    lat = np.fromiter((c.latency_s for c in done), float, len(done))
    out = np.fromiter((c.output_tokens for c in done), float, len(done))
    if solo is None:
        solo_s = FloorSolo.fit(ttft[ok], tpot[ok], out[ok]).estimate(out)
    else:
        solo_s = np.fromiter((solo(c) for c in done), float, len(done))
    ttft_tpot = ok.copy()
    if slo.ttft_s is not None:
        ttft_tpot &= ttft <= slo.ttft_s
    if slo.tpot_s is not None:
        ttft_tpot &= tpot <= slo.tpot_s
    latency = ok & ((solo_s <= 0) | (lat <= slo.latency_scale * solo_s))
    met = ttft_tpot & latency
    if slo.deadline_s is not None:
        met &= lat <= slo.deadline_s
    prompt = np.fromiter((c.prompt_tokens for c in done), float, len(done))
    return {"ok": ok, "ttft": ttft, "tpot": tpot, "lat": lat, "prompt": prompt, "out": out,
            "solo": solo_s, "met": met, "latency_met": latency, "ttft_tpot_met": ttft_tpot}  # fmt: skip


def _window(w: float, span: float, arrivals: int, c: dict[str, np.ndarray]) -> WindowStats:
    ok = c["ok"]
    solo = c["solo"][ok]
    lat = c["lat"][ok]
    has_solo = solo > 0
    mean_solo = float(solo[has_solo].mean()) if has_solo.any() else 0.0
    norm = lat[has_solo] / mean_solo if mean_solo > 0 else np.zeros(0)
    return WindowStats(
        window_s=w,
        span_s=span,
        arrivals=arrivals,
        rate_rps=arrivals / span,
        completed=int(ok.sum()),
        failed=int((~ok).sum()),
        prompt_tokens=LengthStats.of(c["prompt"][ok]),
        output_tokens=LengthStats.of(c["out"][ok]),
        ttft_s=Distribution.of(c["ttft"][ok]),
        tpot_s=Distribution.of(c["tpot"][ok]),
        latency_s=Distribution.of(lat),
        slo_met=int(c["met"].sum()),
        latency_met=int(c["latency_met"].sum()),
        ttft_tpot_met=int(c["ttft_tpot_met"].sum()),
        normalized_sum=float(norm.sum()),
        normalized_count=int(norm.size),
    )
