"""Paper-like workloads when the papers' own data is not at hand: published length statistics and
per-service bursty arrivals.

Lengths (seeded, reproducible; (N, 2) int64 arrays of (prompt_tokens, output_tokens)):

- ``sharegpt_like_lengths``: ShareGPT-like chat requests. The means are the ShareGPT statistics
  published with vLLM (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
  PagedAttention", SOSP 2023, §6.1 and Fig. 11a: mean input 161.31, mean output 337.99 tokens). That
  paper gives histograms, not a dispersion, so the shape is OUR assumption: independent log-normals
  (σ = 1.0 of the log by default, i.e. a coefficient of variation of about 1.3, a heavy right tail
  like the published histograms), with μ set so the uncapped mean is the published one.
- ``longbench_like_lengths``: long-input summarization requests with SeaLLM's Table 1 means for
  LongBench (mean input 13,186.8, mean output 21.1 tokens), same log-normal shape assumption.

Caps (``max_prompt``, ``max_output``) clip after drawing, so a capped mean is below the published one;
callers should report the realized means. Prompt and output are drawn independently (the published
statistics give no joint distribution).

Arrivals: ``multi_service_workload`` merges one Gamma-renewal process per service (mean rate per
service, coefficient of variation ``cv``; cv > 1 is bursty), each service drawing its lengths from its
own pool — the shape of SeaLLM's workload, whose services each get their own Azure Functions arrival
stream (functions assigned round-robin to services, SeaLLM §6.1 "Traces").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from llmfleet.workload.arrivals import SeedLike, rng_from
from llmfleet.workload.request import Workload
from llmfleet.workload.synthesis import ServiceCluster, ServiceMix, lengths_array


@dataclass(frozen=True)
class LengthStats:
    """Published mean prompt / output lengths (tokens) and where they come from."""

    mean_prompt: float
    mean_output: float
    source: str


SHAREGPT_VLLM = LengthStats(
    161.31,
    337.99,
    "ShareGPT, vLLM paper (Kwon et al., SOSP 2023) §6.1, Fig. 11a: mean input 161.31, output 337.99",
)
LONGBENCH_SEALLM = LengthStats(13186.8, 21.1, "LongBench, SeaLLM Table 1: mean input 13,186.8, output 21.1")


def _lognormal_ints(
    rng: np.random.Generator, mean: float, sigma: float, n: int, lo: int, hi: int | None
) -> np.ndarray:
    """n log-normal draws with the given (uncapped) mean and log-σ, rounded, clipped to [lo, hi]."""
    mu = math.log(mean) - sigma * sigma / 2.0
    x = np.rint(rng.lognormal(mu, sigma, n)).astype(np.int64)
    return np.clip(x, lo, hi if hi is not None else np.iinfo(np.int64).max)


def lognormal_lengths(
    stats: LengthStats,
    n: int,
    *,
    seed: SeedLike = 0,
    sigma_prompt: float = 1.0,
    sigma_output: float = 1.0,
    max_prompt: int | None = None,
    max_output: int | None = None,
) -> np.ndarray:
    """``n`` (prompt, output) pairs: independent log-normals with ``stats``' means (prompt >= 1,
    output >= 1), clipped to the caps."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    for name, v in (("mean_prompt", stats.mean_prompt), ("mean_output", stats.mean_output)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be finite and > 0, got {v!r}")
    for name, v in (("sigma_prompt", sigma_prompt), ("sigma_output", sigma_output)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
    for name, v in (("max_prompt", max_prompt), ("max_output", max_output)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1, got {v!r}")
    rng = rng_from(seed)
    p = _lognormal_ints(rng, stats.mean_prompt, sigma_prompt, int(n), 1, max_prompt)
    o = _lognormal_ints(rng, stats.mean_output, sigma_output, int(n), 1, max_output)
    return np.stack([p, o], axis=1)


def sharegpt_like_lengths(n: int, *, seed: SeedLike = 0, **kwargs) -> np.ndarray:
    """ShareGPT-like (prompt, output) pairs (``SHAREGPT_VLLM`` means, log-normal shape; see module doc)."""
    return lognormal_lengths(SHAREGPT_VLLM, n, seed=seed, **kwargs)


def longbench_like_lengths(n: int, *, seed: SeedLike = 0, **kwargs) -> np.ndarray:
    """Long-input summarization pairs (``LONGBENCH_SEALLM`` means, log-normal shape; see module doc)."""
    return lognormal_lengths(LONGBENCH_SEALLM, n, seed=seed, **kwargs)


def multi_service_workload(
    pools: Mapping[str, tuple[str, np.ndarray]],
    rates: Mapping[str, float],
    *,
    duration_s: float,
    cv: float,
    seed: int = 0,
) -> Workload:
    """One Gamma-renewal arrival process per service over [0, duration_s), merged.

    ``pools`` maps service → (model, (N, 2) length samples); ``rates`` maps every service to its mean
    rate (req/s). Gaps have mean 1 / rate and coefficient of variation ``cv`` (1 = Poisson, > 1 bursty);
    each request's lengths are drawn with replacement from its service's pool. Each service has its own
    seeded streams (``ServiceMix.generate``), so the same seed gives the same workload. Request ids are
    ``f"{service}-{j}"``."""
    names = list(pools)
    if not names:
        raise ValueError("pools is empty")
    if sorted(rates) != sorted(names):
        raise ValueError(f"rates must name exactly the services {names}, got {sorted(rates)}")
    arrays = {s: lengths_array(pools[s][1]) for s in names}
    total = sum(a.shape[0] for a in arrays.values())
    services = []
    for s in names:
        a = arrays[s].copy()
        a.setflags(write=False)
        services.append(ServiceCluster(s, pools[s][0], a.shape[0] / total, a))
    mix = ServiceMix(tuple(services))
    return mix.generate(rates={s: float(rates[s]) for s in names}, duration_s=duration_s, cv=cv, seed=seed)
