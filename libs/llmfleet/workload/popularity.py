"""Function popularity → per-service rate shares (SeaLLM §6.1 "Traces").

SeaLLM (like AlpaServe) takes arrivals from the Microsoft Azure Functions trace (MAF): "We round-robin
functions in MAF to LLM services and generate traffic for each service." A service's share of the
total rate is then the summed popularity of the functions dealt to it, so the shares are as unequal as
function popularity is.

The MAF files are not in this repository. Two sources of popularity:

- ``load_function_counts(path)``: per-function invocation counts from a file, either two columns
  ``function,count`` or MAF's ``invocations_per_function_md.anon.d*.csv`` (``HashOwner, HashApp,
  HashFunction, Trigger, 1 … 1440``: the per-minute columns are summed). A line that does not parse
  raises :class:`PopularityFormatError` naming the file and line.
- ``zipf_popularity(n, s)``: a Zipf law, count(rank k) ∝ k^−s. ``MAF_TOP_FRACTION``/``MAF_TOP_MASS``
  are the published heavy-tail statement of the trace (Shahrad et al., "Serverless in the Wild",
  ATC '20, §3: the 18.6 % most popular functions make 99.6 % of the invocations); ``zipf_exponent_for``
  solves s so a Zipf law over n functions matches it (n = 10,000 → s ≈ 1.63; 1,000 → 1.92; 50,000 →
  1.52). Matching one published point with a Zipf law is our assumption, not a fit to the trace.

``round_robin_shares`` deals the functions to services in trace order. MAF's order is by hashed
names, unrelated to popularity, so without a file the ranks are dealt in a seeded random order.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAF_TOP_FRACTION = 0.186  # Shahrad et al. ATC '20 §3: the most popular 18.6 % of functions …
MAF_TOP_MASS = 0.996  # … make 99.6 % of all invocations
DEFAULT_FUNCTIONS = 10_000  # n for the Zipf stand-in (assumption; the exponent's sensitivity is documented)


class PopularityFormatError(ValueError):
    """A popularity file that does not parse; the message names the file and line."""


@dataclass(frozen=True)
class Popularity:
    """Invocation weights of functions in trace order, and where they came from."""

    counts: np.ndarray
    source: str

    def __post_init__(self) -> None:
        c = np.asarray(self.counts, dtype=float)
        if c.ndim != 1 or c.size == 0:
            raise ValueError("popularity needs at least one function")
        if (c < 0).any() or not np.isfinite(c).all() or c.sum() <= 0:
            raise ValueError("popularity counts must be finite, ≥ 0 and not all 0")
        object.__setattr__(self, "counts", c)

    @property
    def n(self) -> int:
        return int(self.counts.size)

    def top_mass(self, fraction: float) -> float:
        """Share of all invocations made by the ``fraction`` most popular functions."""
        c = np.sort(self.counts)[::-1]
        k = max(1, round(fraction * c.size))
        return float(c[:k].sum() / c.sum())


def zipf_weights(n: int, exponent: float) -> np.ndarray:
    """k^−s for ranks k = 1..n, normalised to sum 1."""
    if n < 1:
        raise ValueError(f"n must be ≥ 1, got {n}")
    if exponent < 0:
        raise ValueError(f"exponent must be ≥ 0, got {exponent}")
    w = np.arange(1, n + 1, dtype=float) ** -float(exponent)
    return w / w.sum()


def zipf_exponent_for(n: int, top_fraction: float = MAF_TOP_FRACTION, mass: float = MAF_TOP_MASS) -> float:
    """The Zipf exponent s whose ``top_fraction`` most popular of ``n`` functions make ``mass`` of the
    invocations (bisection; the mass grows with s)."""
    if not 0 < top_fraction < 1 or not 0 < mass < 1:
        raise ValueError(f"top_fraction and mass must be in (0, 1), got {top_fraction}, {mass}")
    k = max(1, round(top_fraction * n))
    if k >= n:
        raise ValueError(f"n = {n} is too small for a top fraction of {top_fraction}")
    lo, hi = 0.0, 16.0
    for _ in range(80):
        mid = (lo + hi) / 2
        w = zipf_weights(n, mid)
        lo, hi = (mid, hi) if w[:k].sum() < mass else (lo, mid)
    return (lo + hi) / 2


def zipf_popularity(
    n: int = DEFAULT_FUNCTIONS, exponent: float | None = None, *, seed: int = 0
) -> Popularity:
    """A Zipf law over ``n`` functions (exponent default: matched to MAF's 18.6 % → 99.6 %), ranks put
    in a seeded random trace order (MAF lists functions by hashed name)."""
    s = zipf_exponent_for(n) if exponent is None else float(exponent)
    w = zipf_weights(n, s)
    order = np.random.default_rng(seed).permutation(n)
    return Popularity(w[order], f"Zipf s = {s:.3f} over {n} functions (seed {seed})")


def _number(text: str, path: Path, line: int, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise PopularityFormatError(f"{path}:{line}: {what} {text!r} is not a number") from None
    if not np.isfinite(v) or v < 0:
        raise PopularityFormatError(f"{path}:{line}: {what} {text!r} must be a finite number ≥ 0")
    return v


def load_function_counts(path: str | Path) -> Popularity:
    """Per-function invocation counts, in file order (see the module docstring for the formats)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"popularity file {p} not found")
    counts: list[float] = []
    with p.open(newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None:
            raise PopularityFormatError(f"{p}:1: empty file")
        maf = len(header) > 4 and header[2].strip() == "HashFunction"
        if not maf and len(header) != 2:
            raise PopularityFormatError(
                f"{p}:1: expected a header 'function,count' or MAF's 'HashOwner,HashApp,HashFunction,"
                f"Trigger,1,…', got {len(header)} columns"
            )
        first = 4 if maf else 1
        for line, row in enumerate(rows, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise PopularityFormatError(f"{p}:{line}: {len(row)} columns, the header has {len(header)}")
            counts.append(sum(_number(c, p, line, "count") for c in row[first:]))
    if not counts:
        raise PopularityFormatError(f"{p}: no function rows after the header")
    if sum(counts) <= 0:
        raise PopularityFormatError(f"{p}: every count is 0")
    return Popularity(np.array(counts), f"{p.name} ({len(counts)} functions)")


def round_robin_shares(pop: Popularity, services: Sequence[str]) -> dict[str, float]:
    """Function i (trace order) → ``services[i % len(services)]``; each service's share of invocations."""
    names = list(services)
    if not names:
        raise ValueError("no services")
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate service names: {names}")
    if pop.n < len(names):
        raise ValueError(f"{pop.n} functions cannot be dealt to {len(names)} services (one each at least)")
    total = pop.counts.sum()
    return {s: float(pop.counts[k :: len(names)].sum() / total) for k, s in enumerate(names)}
