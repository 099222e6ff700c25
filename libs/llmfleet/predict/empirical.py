"""Aladdin's length predictor: the historical output-length distribution conditioned on input length.

Completed requests (``observe``) are filed by their input length into bins (default lower edges
0, 2, 4, 8, ..., 4096 tokens: powers of two; the last bin is open-ended). Each bin keeps at most
``max_samples`` output lengths — a uniform reservoir sample (Algorithm R) driven by a seeded RNG, so a
given observation sequence always yields the same state. ``predict`` answers with the bin's mean (or, if
``statistic`` is a float in (0, 1), that quantile), its standard deviation and ``QUANTILE_LEVELS``.

Re-prediction (Aladdin §length prediction): when ``query.generated_tokens`` reaches the current point
prediction, the answer becomes E[l_out | l_in bin, l_out > generated_tokens], computed on the same
samples restricted to those above ``generated_tokens``.

Fallbacks, in order, when a bin has fewer than ``min_samples`` usable samples: widen to the neighbouring
bins (radius 1, then 2, ... up to ``max_radius``; samples of all bins within the radius are pooled), then
all bins of the service pooled (global), then the prior. For re-prediction with no sample above
``generated_tokens`` anywhere, the answer doubles what has been generated (SeaLLM-style budget
doubling): mean = 2·generated_tokens. ``observations`` reports how many samples the answer rests on
(0 for the prior). Distributions are per service.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

import numpy as np

from llmfleet.predict.base import QUANTILE_LEVELS, LengthQuery, Prediction

DEFAULT_BIN_EDGES: tuple[int, ...] = (0, *(2**k for k in range(1, 13)))


@dataclass
class _Bin:
    samples: list[int] = field(default_factory=list)
    seen: int = 0


@dataclass
class EmpiricalLengthPredictor:
    bin_edges: tuple[int, ...] = DEFAULT_BIN_EDGES
    max_samples: int = 1024
    prior_mean: float = 64.0
    prior_std: float = 32.0
    statistic: str | float = "mean"
    min_samples: int = 8
    max_radius: int = 2
    seed: int = 0
    name: str = "empirical"
    _bins: dict[tuple[str, int], _Bin] = field(default_factory=dict, repr=False)
    _rngs: dict[tuple[str, int], random.Random] = field(default_factory=dict, repr=False)
    # (service, first bin, last bin) -> the samples of those bins pooled, in bin order (read-only);
    # dropped by every observation
    _pooled: dict[tuple[str, int, int], np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.bin_edges or self.bin_edges[0] != 0:
            raise ValueError("bin_edges must start at 0")
        if any(b <= a for a, b in zip(self.bin_edges, self.bin_edges[1:], strict=False)):
            raise ValueError("bin_edges must be strictly increasing")
        if self.max_samples < 1 or self.min_samples < 1:
            raise ValueError("max_samples and min_samples must be >= 1")
        if isinstance(self.statistic, str):
            if self.statistic != "mean":
                raise ValueError("statistic must be 'mean' or a quantile in (0, 1)")
        elif not 0 < self.statistic < 1:
            raise ValueError("statistic must be 'mean' or a quantile in (0, 1)")

    def bin_of(self, prompt_tokens: int) -> int:
        return max(bisect.bisect_right(self.bin_edges, max(prompt_tokens, 0)) - 1, 0)

    def observe(self, query: LengthQuery, output_tokens: int) -> None:
        if output_tokens < 0:
            raise ValueError(f"output_tokens must be >= 0, got {output_tokens}")
        key = (query.service, self.bin_of(query.prompt_tokens))
        self._pooled.clear()
        b = self._bins.setdefault(key, _Bin())
        b.seen += 1
        if len(b.samples) < self.max_samples:
            b.samples.append(int(output_tokens))
            return
        rng = self._rngs.get(key)
        if rng is None:
            rng = self._rngs[key] = random.Random(f"{self.seed}/{key[0]}/{key[1]}")
        j = rng.randrange(b.seen)
        if j < self.max_samples:
            b.samples[j] = int(output_tokens)

    def _pool(self, service: str, k: int, above: int) -> np.ndarray:
        """Samples for bin k (> ``above``), widened to neighbours, then global; empty if none at all."""
        n_bins = len(self.bin_edges)

        def collect(lo: int, hi: int) -> np.ndarray:
            arr = self._pooled.get((service, lo, hi))
            if arr is None:
                ks = range(lo, hi + 1)
                parts = [self._bins[(service, j)].samples for j in ks if (service, j) in self._bins]
                arr = np.fromiter((x for p in parts for x in p), dtype=np.float64)
                arr.flags.writeable = False
                self._pooled[(service, lo, hi)] = arr
            return arr[arr > above] if above >= 0 else arr

        for radius in range(self.max_radius + 1):
            arr = collect(max(k - radius, 0), min(k + radius, n_bins - 1))
            if len(arr) >= self.min_samples:
                return arr
        return collect(0, n_bins - 1)

    def _point(self, arr: np.ndarray) -> float:
        return (
            float(arr.mean()) if self.statistic == "mean" else float(np.quantile(arr, float(self.statistic)))
        )

    def _summarise(self, arr: np.ndarray) -> Prediction:
        point = self._point(arr)
        qs = tuple(float(q) for q in np.quantile(arr, QUANTILE_LEVELS))
        return Prediction(point, float(arr.std()), len(arr), self.name, quantiles=qs)

    def predict(self, query: LengthQuery) -> Prediction:
        k = self.bin_of(query.prompt_tokens)
        arr = self._pool(query.service, k, -1)
        prior = Prediction(self.prior_mean, self.prior_std, 0, self.name)
        pred = self._summarise(arr) if len(arr) else prior
        g = query.generated_tokens
        if g <= 0 or g < pred.mean:
            return pred
        above = self._pool(query.service, k, g)
        if len(above):
            return self._summarise(above)
        return Prediction(2.0 * g, float(g), 0, self.name)

    def predict_mean(self, query: LengthQuery) -> float:
        """``predict(query).mean``, the same float, without the spread and quantiles (for callers that
        read only the point, such as Aladdin's re-prediction)."""
        k = self.bin_of(query.prompt_tokens)
        arr = self._pool(query.service, k, -1)
        point = self._point(arr) if len(arr) else self.prior_mean
        g = query.generated_tokens
        if g <= 0 or g < point:
            return point
        above = self._pool(query.service, k, g)
        if len(above):
            return self._point(above)
        return 2.0 * g

    def predict_many(self, queries: list[LengthQuery]) -> list[Prediction]:
        return [self.predict(q) for q in queries]

    def samples(self, service: str, prompt_tokens: int) -> list[int]:
        """The reservoir of the bin that ``prompt_tokens`` falls in (a copy)."""
        b = self._bins.get((service, self.bin_of(prompt_tokens)))
        return list(b.samples) if b else []
