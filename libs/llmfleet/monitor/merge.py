"""Merging several reporters' statistics of one service (the placement leader hears every scheduler).

Each scheduler sees a disjoint part of a service's traffic, so per window:

- arrivals, completions, failures and the SLO counters add; so do rates (each is the reporter's own
  arrivals over its own span) and the normalized-latency sums (each reporter normalizes by its own
  L̂_s estimate: the merged value is the count-weighted mean of the reporters' means);
- prompt and output lengths combine exactly from (count, mean, M2) (Chan's pairwise Welford);
- TTFT/TPOT/latency percentiles cannot be combined from percentiles: the merged distribution is
  that of the reporter with the most completed requests in the window (exact with one scheduler;
  with several behind a balancing front end each sees statistically the same traffic); its mean is
  the count-weighted mean of all;
- samples: the union, cut to the period every reporter's samples cover (a reporter whose sample
  bound was reached holds only its most recent arrivals), then the most recent ``max_samples``.

Windows are matched by length; configure every scheduler with the same windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from llmfleet.monitor.stats import Distribution, LengthStats, ServiceStats, WindowStats


def _mean_of(dists: Sequence[Distribution], pick: Distribution) -> Distribution:
    n = sum(d.count for d in dists)
    mean = sum(d.mean * d.count for d in dists) / n if n else 0.0
    return replace(pick, count=n, mean=mean)


def merge_windows(parts: Sequence[WindowStats]) -> WindowStats:
    """One window (all of the same ``window_s``) from several reporters."""
    if not parts:
        raise ValueError("nothing to merge")
    if len(parts) == 1:
        return parts[0]
    top = max(parts, key=lambda w: w.completed)
    return WindowStats(
        window_s=parts[0].window_s,
        span_s=max(w.span_s for w in parts),
        arrivals=sum(w.arrivals for w in parts),
        rate_rps=sum(w.rate_rps for w in parts),
        completed=sum(w.completed for w in parts),
        failed=sum(w.failed for w in parts),
        prompt_tokens=LengthStats.merge(w.prompt_tokens for w in parts),
        output_tokens=LengthStats.merge(w.output_tokens for w in parts),
        ttft_s=_mean_of([w.ttft_s for w in parts], top.ttft_s),
        tpot_s=_mean_of([w.tpot_s for w in parts], top.tpot_s),
        latency_s=_mean_of([w.latency_s for w in parts], top.latency_s),
        slo_met=sum(w.slo_met for w in parts),
        latency_met=sum(w.latency_met for w in parts),
        ttft_tpot_met=sum(w.ttft_tpot_met for w in parts),
        normalized_sum=sum(w.normalized_sum for w in parts),
        normalized_count=sum(w.normalized_count for w in parts),
    )


def merge_services(parts: Sequence[ServiceStats], max_samples: int = 512) -> ServiceStats:
    """One service's statistics from several reporters (see the module docstring)."""
    if not parts:
        raise ValueError("nothing to merge")
    by_window: dict[float, list[WindowStats]] = {}
    for p in parts:
        for w in p.windows:
            by_window.setdefault(w.window_s, []).append(w)
    windows = tuple(merge_windows(ws) for _, ws in sorted(by_window.items()))
    cut = max((p.samples[0].arrival_s for p in parts if not p.samples_complete and p.samples), default=None)
    samples = sorted((s for p in parts for s in p.samples), key=lambda s: s.arrival_s)
    if cut is not None:
        samples = [s for s in samples if s.arrival_s >= cut]
    complete = cut is None and len(samples) <= max_samples
    samples = samples[-max_samples:] if max_samples else []
    model = next((p.model for p in parts if p.model), "")
    infeasible = sum(p.infeasible for p in parts)
    queued, cold, held = (sum(getattr(p, k) for p in parts) for k in ("queued", "cold", "held"))
    return ServiceStats(
        parts[0].service, model, windows, tuple(samples), complete, infeasible, queued, cold, held
    )
