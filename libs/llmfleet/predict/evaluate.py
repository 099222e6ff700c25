"""Held-out evaluation of a length predictor (pure: the clock for latency is passed in).

Point estimate (``point``): ``"median"`` (default) uses a prediction's median ``quantiles[0]`` when the
predictor reports quantiles and its ``mean`` otherwise — the per-service mean predictor reports none,
so the baseline is its mean, as defined by SeaLLM; ``"mean"`` always uses ``mean``. MAE is minimised
by the median of the predictive distribution, so a predictor that has one is scored on it.

Metrics (``evaluate`` returns a dict):
  ``n`` — items; ``point`` — which estimate was scored; ``acc_100`` — fraction whose point estimate
  falls in the same 100-token bucket as the true length; ``acc_pow2`` — the same with power-of-two
  buckets; ``mae`` — mean |point − true| in tokens; ``mae_mean`` — mean |mean − true| (the same as
  ``mae`` for predictors without quantiles); ``latency_p50_ms`` / ``latency_p99_ms`` — per batch of
  ``batch_size`` queries (None when no ``clock`` is given; p99 by linear interpolation over the batches).
Batches go through ``predict_many`` when the predictor has it, else ``predict`` one by one. With
``passes`` > 1 the items are predicted that many times, ``reset()`` (e.g. clearing a feature cache)
running before each pass, and the latencies of all passes are pooled; metrics come from the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from llmfleet.predict.base import LengthPredictor, LengthQuery, Prediction
from llmfleet.predict.buckets import bucket_accuracy, hundred_token_buckets, power_of_two_buckets
from llmfleet.predict.dataset import LengthItem


def predict_batch(predictor: LengthPredictor, queries: list[LengthQuery]) -> list[Prediction]:
    many = getattr(predictor, "predict_many", None)
    return list(many(queries)) if many is not None else [predictor.predict(q) for q in queries]


def evaluate(
    predictor: LengthPredictor,
    items: Sequence[LengthItem],
    *,
    service: str = "default",
    batch_size: int = 32,
    clock: Callable[[], float] | None = None,
    point: str = "median",
    passes: int = 1,
    reset: Callable[[], object] | None = None,
) -> dict:
    if batch_size < 1 or passes < 1:
        raise ValueError("batch_size and passes must be >= 1")
    if point not in ("median", "mean"):
        raise ValueError("point must be 'median' or 'mean'")
    means: list[float] = []
    points: list[float] = []
    medians = 0
    latencies: list[float] = []
    for i in [i for _ in range(passes) for i in range(0, len(items), batch_size)]:
        if i == 0 and reset is not None:
            reset()
        chunk = items[i : i + batch_size]
        queries = [LengthQuery(service, it.prompt, it.prompt_tokens) for it in chunk]
        start = clock() if clock else 0.0
        preds = predict_batch(predictor, queries)
        if clock:
            latencies.append((clock() - start) * 1000.0)
        if len(points) >= len(items):
            continue
        means.extend(p.mean for p in preds)
        for p in preds:
            use_median = point == "median" and bool(p.quantiles)
            points.append(p.quantiles[0] if use_median else p.mean)
            medians += use_median
    actual = [it.output_tokens for it in items]
    scored = "median" if medians == len(points) and points else "mean" if not medians else "mixed"
    return {
        "predictor": getattr(predictor, "name", type(predictor).__name__),
        "n": len(items),
        "point": scored,
        "acc_100": bucket_accuracy(hundred_token_buckets(), points, actual),
        "acc_pow2": bucket_accuracy(power_of_two_buckets(), points, actual),
        "mae": _mae(points, actual),
        "mae_mean": _mae(means, actual),
        "latency_p50_ms": float(np.percentile(latencies, 50)) if latencies else None,
        "latency_p99_ms": float(np.percentile(latencies, 99)) if latencies else None,
    }


def _mae(predicted: Sequence[float], actual: Sequence[float]) -> float:
    if not actual:
        return float("nan")
    return float(np.mean(np.abs(np.asarray(predicted, dtype=float) - np.asarray(actual, dtype=float))))
