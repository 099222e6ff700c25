"""Seeded arrival processes: sorted float64 arrays of arrival times in seconds from t = 0.

Renewal processes (``poisson``, ``gamma``) take exactly one of ``n`` (that many arrivals) or
``duration_s`` (every arrival in [0, duration_s)). The first arrival comes one inter-arrival gap after
t = 0, not at 0. ``seed`` is an int, a ``numpy.random.SeedSequence`` or a ``numpy.random.Generator``
(which is advanced); the same int seed gives the same array.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

SeedLike = int | np.random.SeedSequence | np.random.Generator


def rng_from(seed: SeedLike) -> np.random.Generator:
    """A Generator for ``seed``; a Generator is returned as is."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer | np.random.SeedSequence):
        raise TypeError(f"seed must be an int, SeedSequence or Generator, got {type(seed).__name__}")
    return np.random.default_rng(seed)


def _positive(name: str, value: float) -> float:
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def _n_or_duration(n: int | None, duration_s: float | None) -> None:
    if (n is None) == (duration_s is None):
        raise ValueError("give exactly one of n or duration_s")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0):
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    if duration_s is not None:
        _positive("duration_s", duration_s)


def _renewal(
    gaps: Callable[[np.random.Generator, int], np.ndarray],
    mean_gap: float,
    n: int | None,
    duration_s: float | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """Cumulative sums of i.i.d. gaps: ``n`` of them, or all that fall before ``duration_s``."""
    _n_or_duration(n, duration_s)
    if n is not None:
        return np.cumsum(gaps(rng, int(n)))
    assert duration_s is not None
    chunk = max(64, math.ceil(1.1 * duration_s / mean_gap) + 32)
    pieces: list[np.ndarray] = []
    t = 0.0
    while t < duration_s:
        times = t + np.cumsum(gaps(rng, chunk))
        pieces.append(times)
        t = float(times[-1])
    out = np.concatenate(pieces) if pieces else np.empty(0)
    return out[out < duration_s]


def poisson(
    rate_rps: float, *, n: int | None = None, duration_s: float | None = None, seed: SeedLike = 0
) -> np.ndarray:
    """Homogeneous Poisson arrivals: exponential gaps with mean ``1 / rate_rps``."""
    rate = _positive("rate_rps", rate_rps)
    return _renewal(lambda g, m: g.exponential(1.0 / rate, m), 1.0 / rate, n, duration_s, rng_from(seed))


def gamma(
    rate_rps: float,
    cv: float,
    *,
    n: int | None = None,
    duration_s: float | None = None,
    seed: SeedLike = 0,
) -> np.ndarray:
    """Gamma-renewal arrivals: gaps with mean ``1 / rate_rps`` and coefficient of variation ``cv``.

    shape = 1 / cv², scale = 1 / (rate · shape). cv = 1 is Poisson in distribution (not the same draws
    as ``poisson``); cv > 1 is burstier, cv < 1 more regular.
    """
    rate = _positive("rate_rps", rate_rps)
    shape = 1.0 / _positive("cv", cv) ** 2
    scale = 1.0 / (rate * shape)
    return _renewal(lambda g, m: g.gamma(shape, scale, m), 1.0 / rate, n, duration_s, rng_from(seed))


def replay_index(
    timestamps: Sequence[float] | np.ndarray,
    *,
    rate_scale: float = 1.0,
    start_s: float = 0.0,
    end_s: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``replay``'s arrivals and, for each, its index into ``timestamps``."""
    ts = np.asarray(timestamps, dtype=float)
    if ts.ndim != 1:
        raise ValueError(f"timestamps must be 1-D, got shape {ts.shape}")
    if not np.all(np.isfinite(ts)):
        raise ValueError("timestamps must be finite")
    scale = _positive("rate_scale", rate_scale)
    if not math.isfinite(start_s) or start_s < 0:
        raise ValueError(f"start_s must be finite and >= 0, got {start_s!r}")
    if end_s is not None and not end_s > start_s:
        raise ValueError(f"end_s must be > start_s, got start_s={start_s}, end_s={end_s}")
    order = np.argsort(ts, kind="stable")
    if ts.size == 0:
        return order, np.empty(0)
    offsets = ts[order] - ts[order[0]]
    keep = offsets >= start_s
    if end_s is not None:
        keep &= offsets < end_s
    return order[keep], (offsets[keep] - start_s) / scale


def replay(
    timestamps: Sequence[float] | np.ndarray,
    *,
    rate_scale: float = 1.0,
    start_s: float = 0.0,
    end_s: float | None = None,
) -> np.ndarray:
    """Recorded arrivals, replayed.

    Timestamps (seconds, any origin, any order) are sorted and made relative to the earliest; those in
    [start_s, end_s) of that trace time are kept and re-based to start at ``start_s`` = 0, then divided
    by ``rate_scale`` (2.0 replays at twice the rate).
    """
    return replay_index(timestamps, rate_scale=rate_scale, start_s=start_s, end_s=end_s)[1]


def _segments(segments: Sequence[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """Validated ``(start_s, duration_s, rate_rps)`` of back-to-back ``(duration_s, rate_rps)`` segments."""
    if len(segments) == 0:
        raise ValueError("segments must not be empty")
    out, t0 = [], 0.0
    for i, seg in enumerate(segments):
        try:
            dur, rate = (float(x) for x in seg)
        except (TypeError, ValueError):
            raise ValueError(f"segment {i}: expected (duration_s, rate_rps), got {seg!r}") from None
        if not (math.isfinite(dur) and dur > 0):
            raise ValueError(f"segment {i}: duration_s must be finite and > 0, got {dur}")
        if not (math.isfinite(rate) and rate >= 0):
            raise ValueError(f"segment {i}: rate_rps must be finite and >= 0, got {rate}")
        out.append((t0, dur, rate))
        t0 += dur
    return out


def piecewise_poisson(segments: Sequence[tuple[float, float]], *, seed: SeedLike = 0) -> np.ndarray:
    """Non-homogeneous Poisson arrivals with a piecewise-constant rate.

    ``segments`` is a sequence of ``(duration_s, rate_rps)``, back to back from t = 0; a rate of 0 is an
    idle period. Each segment draws a Poisson(rate · duration) count of uniform times within it.
    """
    rng = rng_from(seed)
    pieces = []
    for t0, dur, rate in _segments(segments):
        count = rng.poisson(rate * dur)
        pieces.append(np.sort(t0 + rng.uniform(0.0, dur, count)))
    return np.concatenate(pieces)


def piecewise_gamma(
    segments: Sequence[tuple[float, float]], cv: float = 1.0, *, seed: SeedLike = 0
) -> np.ndarray:
    """Bursty arrivals with a piecewise-constant rate: in each ``(duration_s, rate_rps)`` segment (back
    to back from t = 0; rate 0 is idle), Gamma-renewal gaps with mean ``1 / rate`` and coefficient of
    variation ``cv`` (1 = exponential gaps). The renewal restarts at each segment's start."""
    _positive("cv", cv)
    rng = rng_from(seed)
    pieces = []
    for t0, dur, rate in _segments(segments):
        if rate > 0:
            pieces.append(t0 + gamma(rate, cv, duration_s=dur, seed=rng))
    return np.concatenate(pieces) if pieces else np.empty(0)


def per_service_arrivals(
    rates: Mapping[str, float | Sequence[tuple[float, float]]],
    duration_s: float,
    *,
    cv: float | Mapping[str, float] = 1.0,
    seed: SeedLike = 0,
) -> dict[str, np.ndarray]:
    """One arrival process per service over [0, duration_s): a constant rate (req/s) or piecewise
    ``(duration_s, rate_rps)`` segments (idle after the last), Gamma gaps with coefficient of variation
    ``cv`` (one for all, or per service; 1 = Poisson). Each service draws from its own stream of
    ``seed``, in the mapping's order, so adding a service leaves the others' arrivals unchanged only
    when it comes last."""
    _positive("duration_s", duration_s)
    names = list(rates)
    cvs = {n: float(cv[n]) if isinstance(cv, Mapping) else float(cv) for n in names}
    rng_from(seed)  # validates the seed's type
    if isinstance(seed, np.random.Generator):
        streams = seed.spawn(len(names))
    else:
        root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(int(seed))
        streams = [np.random.default_rng(s) for s in root.spawn(len(names))]
    out = {}
    for name, stream in zip(names, streams, strict=True):
        how = rates[name]
        if isinstance(how, int | float):
            rate = float(how)
            if not (math.isfinite(rate) and rate >= 0):
                raise ValueError(f"service {name!r}: rate must be finite and >= 0, got {how!r}")
            segs: Sequence[tuple[float, float]] = [(duration_s, rate)]
        else:
            segs = how
        t = piecewise_gamma(segs, cvs[name], seed=stream)
        out[name] = t[t < duration_s]
    return out


def thinned_poisson(
    rate_fn: Callable[[np.ndarray], np.ndarray],
    rate_max: float,
    duration_s: float,
    *,
    seed: SeedLike = 0,
) -> np.ndarray:
    """Non-homogeneous Poisson arrivals on [0, duration_s) by thinning (Lewis–Shedler).

    ``rate_fn`` maps an array of times to rates in [0, rate_max]; a candidate from a Poisson(rate_max)
    process at time t is kept with probability rate_fn(t) / rate_max.
    """
    lam = _positive("rate_max", rate_max)
    rng = rng_from(seed)
    cand = poisson(lam, duration_s=duration_s, seed=rng)
    rates = np.asarray(rate_fn(cand), dtype=float)
    if rates.shape != cand.shape:
        raise ValueError(f"rate_fn returned shape {rates.shape} for {cand.shape} times")
    if np.any(~np.isfinite(rates)) or np.any(rates < 0) or np.any(rates > lam * (1 + 1e-12)):
        raise ValueError(f"rate_fn must return finite rates in [0, rate_max={lam}]")
    return cand[rng.uniform(0.0, 1.0, cand.size) * lam < rates]


def sinusoid_poisson(
    mean_rps: float,
    amplitude: float,
    period_s: float,
    duration_s: float,
    *,
    phase: float = 0.0,
    seed: SeedLike = 0,
) -> np.ndarray:
    """Poisson arrivals with rate mean_rps · (1 + amplitude · sin(2π t / period_s + phase)).

    ``amplitude`` is relative, in [0, 1]: 0.5 swings the rate between 0.5× and 1.5× the mean.
    """
    mean = _positive("mean_rps", mean_rps)
    period = _positive("period_s", period_s)
    if not 0 <= amplitude <= 1:
        raise ValueError(f"amplitude must be in [0, 1], got {amplitude!r}")

    def rate(t: np.ndarray) -> np.ndarray:
        return mean * (1 + amplitude * np.sin(2 * np.pi * t / period + phase))

    return thinned_poisson(rate, mean * (1 + amplitude), duration_s, seed=seed)
