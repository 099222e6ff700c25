"""Held-out evaluation of a length predictor (pure: the clock for latency is passed in).

Metrics (``evaluate`` returns a dict):
  ``n`` — items; ``acc_100`` — fraction whose predicted mean falls in the same 100-token bucket as the
  true length; ``acc_pow2`` — the same with power-of-two buckets; ``mae`` — mean |mean − true| in
  tokens; ``latency_p50_ms`` / ``latency_p99_ms`` — per batch of ``batch_size`` queries (None when no
  ``clock`` is given; p99 by linear interpolation over the batches).
Batches go through ``predict_many`` when the predictor has it, else ``predict`` one by one.
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
) -> dict:
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    means: list[float] = []
    latencies: list[float] = []
    for i in range(0, len(items), batch_size):
        chunk = items[i : i + batch_size]
        queries = [LengthQuery(service, it.prompt, it.prompt_tokens) for it in chunk]
        start = clock() if clock else 0.0
        preds = predict_batch(predictor, queries)
        if clock:
            latencies.append((clock() - start) * 1000.0)
        means.extend(p.mean for p in preds)
    actual = [it.output_tokens for it in items]
    return {
        "predictor": getattr(predictor, "name", type(predictor).__name__),
        "n": len(items),
        "acc_100": bucket_accuracy(hundred_token_buckets(), means, actual),
        "acc_pow2": bucket_accuracy(power_of_two_buckets(), means, actual),
        "mae": float(np.mean(np.abs(np.asarray(means) - np.asarray(actual)))) if items else float("nan"),
        "latency_p50_ms": float(np.percentile(latencies, 50)) if latencies else None,
        "latency_p99_ms": float(np.percentile(latencies, 99)) if latencies else None,
    }
