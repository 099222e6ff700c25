"""Output-length bucket schemes and accuracy helpers (pure).

A scheme is a sorted tuple of lower edges starting at 0; bucket ``k`` holds lengths ``n`` with
``edges[k] <= n < edges[k + 1]`` and the last bucket is open-ended (``n >= edges[-1]``). For reporting
(``Prediction.buckets``) the last bucket's upper edge is ``cap``.

Schemes shipped:

* ``hundred_token_buckets()``: [0,100), [100,200), ... , [1900,2000), [2000, ∞) — the 100-token buckets
  of the S³/UELLM accuracy metric.
* ``power_of_two_buckets()``: [0,1), [1,2), [2,4), [4,8), ..., [1024,2048), [2048, ∞).
* ``fine_buckets()``: [0,8), [8,16), [16,24), [24,32), [32,48), [48,64), [64,80), [80,96), [96,128),
  [128,160), [160,192), [192,256), [256,320), [320,384), [384,512), [512, ∞) — finer where Alpaca-style
  answers are dense; the learned predictor's default classes.

Representative length of a bucket: by default its midpoint (the open top bucket: ``edges[-1] * 1.25``);
``fit_representatives(lengths)`` replaces them by the conditional mean of training lengths falling in each
bucket (midpoint kept for buckets with no training data).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class BucketScheme:
    name: str
    edges: tuple[int, ...]
    representatives: tuple[float, ...] = field(default=())
    cap: int = 0

    def __post_init__(self) -> None:
        if not self.edges or self.edges[0] != 0:
            raise ValueError("bucket edges must start at 0")
        if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            raise ValueError("bucket edges must be strictly increasing")
        if not self.representatives:
            reps = [(a + b) / 2 for a, b in zip(self.edges, self.edges[1:], strict=False)]
            reps.append(self.edges[-1] * 1.25 if self.edges[-1] > 0 else 1.0)
            object.__setattr__(self, "representatives", tuple(reps))
        if len(self.representatives) != len(self.edges):
            raise ValueError("one representative per bucket")
        if self.cap <= self.edges[-1]:
            object.__setattr__(self, "cap", max(2 * self.edges[-1], 1))

    def __len__(self) -> int:
        return len(self.edges)

    def bucket_of(self, n: float) -> int:
        """Index of the bucket holding length ``n`` (negative lengths count as 0)."""
        return max(bisect.bisect_right(self.edges, max(n, 0)) - 1, 0)

    def upper_edges(self) -> tuple[int, ...]:
        """Exclusive upper edge of every bucket (``cap`` for the open-ended last one)."""
        return (*self.edges[1:], self.cap)

    def representative(self, k: int) -> float:
        return self.representatives[k]

    def fit_representatives(self, lengths: Sequence[int]) -> BucketScheme:
        """A copy whose representatives are the mean training length in each bucket (midpoint if none)."""
        sums = [0.0] * len(self.edges)
        counts = [0] * len(self.edges)
        for n in lengths:
            k = self.bucket_of(n)
            sums[k] += n
            counts[k] += 1
        base = BucketScheme(self.name, self.edges, cap=self.cap).representatives
        reps = tuple(s / c if c else r for s, c, r in zip(sums, counts, base, strict=True))
        return replace(self, representatives=reps)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "edges": list(self.edges),
            "representatives": list(self.representatives),
            "cap": self.cap,
        }

    @classmethod
    def from_dict(cls, d: dict) -> BucketScheme:
        return cls(d["name"], tuple(d["edges"]), tuple(d["representatives"]), d["cap"])


def hundred_token_buckets(max_tokens: int = 2000, width: int = 100) -> BucketScheme:
    return BucketScheme(f"{width}-token", tuple(range(0, max_tokens + 1, width)))


def power_of_two_buckets(max_tokens: int = 2048) -> BucketScheme:
    edges = [0, 1]
    while edges[-1] * 2 <= max_tokens:
        edges.append(edges[-1] * 2)
    return BucketScheme("power-of-two", tuple(edges))


def fine_buckets() -> BucketScheme:
    return BucketScheme("fine", (0, 8, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512))


def same_bucket(scheme: BucketScheme, predicted: float, actual: float) -> bool:
    return scheme.bucket_of(predicted) == scheme.bucket_of(actual)


def bucket_accuracy(scheme: BucketScheme, predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Fraction of pairs whose predicted length lands in the same bucket as the actual length."""
    if len(predicted) != len(actual):
        raise ValueError("predicted and actual differ in length")
    if not actual:
        return float("nan")
    return sum(same_bucket(scheme, p, a) for p, a in zip(predicted, actual, strict=True)) / len(actual)
