"""A rate-step workload as a trace file both ``llmfleet load --trace`` and ``llmfleet sim --trace`` read
(``TIMESTAMP,ContextTokens,GeneratedTokens``, numeric seconds), so the live fleet and the simulator see
the very same requests.

Arrivals are a seeded Poisson process per phase (``(rate req/s, seconds)``, in order). Each request's
prompt and output lengths are drawn, with the same seed, from the rows of a length source: the conv
trace (``../shared/traces/azure_llm_2023_conv.csv``) when it is there, otherwise a log-normal fitted by
hand to that trace's medians (prompt ≈ 1,000, output ≈ 200 tokens; stated here, not measured)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from llmfleet.workload.azure_trace import read_azure_trace


def _lengths(source: Path | None, n: int, rng: np.random.Generator) -> np.ndarray:
    if source is not None and source.exists():
        rows = read_azure_trace(source)
        table = np.array([(r.prompt_tokens, r.output_tokens) for r in rows], dtype=int)
        return table[rng.integers(0, len(table), n)]
    prompt = np.clip(rng.lognormal(np.log(1000), 0.9, n), 16, 4000).astype(int)
    output = np.clip(rng.lognormal(np.log(200), 0.8, n), 4, 1500).astype(int)
    return np.stack([prompt, output], axis=1)


def write_step_trace(
    path: Path, phases: Sequence[tuple[float, float]], lengths_from: Path | None, seed: int = 0
) -> int:
    """Write the trace; returns its number of requests."""
    rng = np.random.default_rng(seed)
    times: list[float] = []
    t0 = 0.0
    for rate, seconds in phases:
        if rate < 0 or seconds <= 0:
            raise ValueError(f"a phase needs rate >= 0 and seconds > 0, got ({rate}, {seconds})")
        if rate > 0:
            t = t0 + rng.exponential(1.0 / rate)
            while t < t0 + seconds:
                times.append(t)
                t += rng.exponential(1.0 / rate)
        t0 += seconds
    lengths = _lengths(lengths_from, len(times), rng)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for t, (p, o) in zip(times, lengths, strict=True):
            w.writerow([f"{t:.6f}", int(p), int(o)])
    return len(times)
