"""Latency / TTFT / TPOT / throughput summaries of per-request timings and live-vs-sim comparisons."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else 0.0


def summarize(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """rows: arrival_s, first_token_s, finish_s, output_tokens (seconds on one clock). Throughput is
    over the makespan, first arrival to last finish (as ``llmfleet.sim.metrics``)."""
    if not rows:
        raise ValueError("no requests to summarize")
    lat = [r["finish_s"] - r["arrival_s"] for r in rows]
    ttft = [r["first_token_s"] - r["arrival_s"] for r in rows]
    tpot = [
        (r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
        for r in rows
        if r["output_tokens"] > 1
    ]
    span = max(r["finish_s"] for r in rows) - min(r["arrival_s"] for r in rows)
    return {
        "requests": len(rows),
        "latency_mean_s": float(np.mean(lat)),
        "latency_p50_s": percentile(lat, 50),
        "latency_p99_s": percentile(lat, 99),
        "ttft_mean_s": float(np.mean(ttft)),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_mean_s": float(np.mean(tpot)) if tpot else 0.0,
        "makespan_s": span,
        "throughput_rps": len(rows) / span if span > 0 else 0.0,
        "throughput_tokens_per_s": sum(r["output_tokens"] for r in rows) / span if span > 0 else 0.0,
    }


COMPARED = (
    ("latency_mean_s", "mean latency (s)"),
    ("latency_p50_s", "p50 latency (s)"),
    ("latency_p99_s", "p99 latency (s)"),
    ("ttft_mean_s", "mean TTFT (s)"),
    ("ttft_p99_s", "p99 TTFT (s)"),
    ("tpot_mean_s", "mean TPOT (s)"),
    ("throughput_rps", "throughput (req/s)"),
    ("throughput_tokens_per_s", "throughput (tok/s)"),
)
HEADLINE = ("latency_mean_s", "latency_p99_s", "throughput_rps")  # the three


def rel_diff(sim: float, live: float) -> float:
    """(sim − live) / live; NaN when live is 0."""
    return (sim - live) / live if live else math.nan


def compare(live: dict[str, float], sim: dict[str, float]) -> dict[str, dict[str, float]]:
    return {
        k: {"live": live[k], "sim": sim[k], "rel_diff": rel_diff(sim[k], live[k])}
        for k, _ in COMPARED
        if k in live and k in sim
    }


def mean_summary(summaries: Sequence[dict[str, float]]) -> dict[str, float]:
    """Metric-wise mean of several runs' summaries."""
    return {k: float(np.mean([x[k] for x in summaries])) for k in summaries[0]}


def spread(summaries: Sequence[dict[str, float]]) -> dict[str, float]:
    """Run-to-run noise per metric: (max − min) / mean over the runs (0 for one run)."""
    out = {}
    for k in summaries[0]:
        v = [x[k] for x in summaries]
        m = float(np.mean(v))
        out[k] = (max(v) - min(v)) / m if m else 0.0
    return out


def little_latency(samples: Sequence[tuple[float, int]], requests: int) -> float:
    """Mean time a request spends in the engine, by Little's law over the engine's own load snapshots:
    ∫ (running + waiting) dt / requests (the engine is empty before and after the workload)."""
    area = sum(n * (t1 - t0) for (t0, n), (t1, _) in itertools.pairwise(samples))
    return area / requests if requests else 0.0


def summarize_usage(rows: Sequence[dict[str, Any]], prefix: str) -> dict[str, float]:
    """Latency metrics from a component's own per-request Usage (``{prefix}_ttft_s``, ``{prefix}_latency_s``:
    its arrival -> first / last token), i.e. without the hops in front of it."""
    lat = [r[f"{prefix}_latency_s"] for r in rows]
    ttft = [r[f"{prefix}_ttft_s"] for r in rows]
    tpot = [
        (r[f"{prefix}_latency_s"] - r[f"{prefix}_ttft_s"]) / (r["output_tokens"] - 1)
        for r in rows
        if r["output_tokens"] > 1
    ]
    return {
        "latency_mean_s": float(np.mean(lat)),
        "latency_p50_s": percentile(lat, 50),
        "latency_p99_s": percentile(lat, 99),
        "ttft_mean_s": float(np.mean(ttft)),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_mean_s": float(np.mean(tpot)) if tpot else 0.0,
    }
