"""Per-iteration framework overhead, fitted on Vidur's CPU-overhead profile of vLLM on A100.

The roofline (``costmodel.roofline``) has no fixed cost per iteration, so larger tensor parallelism
always looks better to Aladdin's Eq. 6 (a worker of N GPUs splits the weight read N ways and pays
nothing for it). A real engine pays per iteration for scheduling, input preparation, sampling and
output processing, and, with TP > 1 in vLLM 0.2–0.4, the Ray round trip to its workers.

Data: ``VIDUR_A100_CPU_OVERHEAD_MS`` is derived from Microsoft Vidur's profile
(github.com/microsoft/vidur, ``data/profiling/a100/cpu_overheads.csv`` at commit
6d98aa8f71696520acc603d87439e77cc78160a7, MIT license, © Microsoft Corporation): per (model, TP,
batch), schedule + sampler_e2e + prepare_inputs_e2e + process_model_outputs medians + ray_comm_time
mean, in ms — the sum Vidur itself adds per iteration (``ExecutionTime._get_cpu_overhead``).

Fit: per TP degree in the data (1, 2, 4), least squares of overhead = a + c·b over every model's rows;
a TP without rows takes the nearest measured TP's fit (TP 8 → TP 4). ``max_rel_error`` is the fit's
largest relative residual.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

VIDUR_SOURCE = "microsoft/vidur@6d98aa8 data/profiling/a100/cpu_overheads.csv (MIT)"

# (model, TP, ((batch, ms), ...)): derived table, see the module docstring
# fmt: off
VIDUR_A100_CPU_OVERHEAD_MS: tuple[tuple[str, int, tuple[tuple[int, float], ...]], ...] = (
    ("CodeLlama-34b-Instruct-hf", 2, (
        (8, 8.031), (16, 8.472), (24, 8.7), (32, 9.076), (40, 9.426), (48, 9.878), (56, 10.126),
        (64, 10.482), (64, 10.503), (80, 11.279), (96, 12.002), (112, 12.567), (128, 13.415),
    )),
    ("Llama-2-70b-hf", 4, (
        (8, 8.395), (16, 8.768), (24, 9.218), (32, 9.407), (40, 9.817), (48, 10.398), (56, 10.516),
        (64, 10.847), (64, 10.883), (80, 11.662), (96, 12.156), (112, 13.094), (128, 13.662),
    )),
    ("Llama-2-7b-hf", 1, (
        (8, 1.394), (16, 1.796), (24, 2.132), (32, 2.432), (40, 2.875), (48, 3.272), (56, 3.678),
        (64, 4.06), (64, 4.084), (80, 4.868), (96, 5.709), (112, 6.492), (128, 7.226),
    )),
    ("Qwen-72B", 4, (
        (8, 8.525), (16, 8.713), (24, 9.111), (32, 9.64), (40, 9.916), (48, 10.388), (56, 10.868),
        (64, 11.044), (64, 11.096), (80, 11.674), (96, 12.467), (112, 10.434), (128, 11.407),
    )),
    ("internlm-20b", 2, (
        (8, 8.204), (16, 8.435), (24, 8.562), (32, 9.042), (40, 9.458), (48, 9.772), (56, 10.238),
        (64, 10.466), (64, 10.473), (80, 11.053), (96, 11.792), (112, 12.761), (128, 13.378),
    )),
    ("phi-2", 1, (
        (8, 1.406), (16, 1.771), (24, 2.171), (32, 2.539), (40, 2.893), (48, 3.296), (56, 3.658),
        (64, 4.06), (64, 4.072), (80, 4.828), (96, 5.64), (112, 6.47), (128, 7.124),
    )),
)


@dataclass(frozen=True)
class IterationOverhead:
    """overhead(b, tp) = a[tp] + c[tp]·b seconds; ``fits`` maps TP → (a_s, c_s)."""

    fits: Mapping[int, tuple[float, float]]
    source: str = "fitted"
    max_rel_error: float = 0.0

    def __post_init__(self) -> None:
        if not self.fits:
            raise ValueError("an overhead model needs at least one TP degree")
        for tp, (a, c) in self.fits.items():
            if tp < 1 or a < 0 or c < 0:
                raise ValueError(f"bad overhead fit for TP {tp}: a = {a}, c = {c} (need TP ≥ 1, a, c ≥ 0)")

    def coefficients(self, tp: int) -> tuple[float, float]:
        """(a, c) of the nearest measured TP degree in log2 (ties to the larger)."""
        if tp < 1:
            raise ValueError(f"tensor-parallel degree must be ≥ 1, got {tp}")
        best = min(self.fits, key=lambda k: (abs(math.log2(k) - math.log2(tp)), -k))
        return self.fits[best]

    def __call__(self, batch: float, tp: int = 1) -> float:
        a, c = self.coefficients(tp)
        return a + c * max(float(batch), 0.0)


def constant_overhead(seconds: float) -> IterationOverhead:
    """The same overhead at every batch and TP (e.g. the vidur source's 2 ms assumption)."""
    if seconds < 0:
        raise ValueError(f"overhead must be ≥ 0, got {seconds}")
    return IterationOverhead({1: (float(seconds), 0.0)}, source=f"constant {seconds * 1e3:g} ms")


def fit_overhead(
    rows: Iterable[tuple[str, int, Iterable[tuple[int, float]]]] = VIDUR_A100_CPU_OVERHEAD_MS,
    source: str = VIDUR_SOURCE,
) -> IterationOverhead:
    """Least squares of a + c·b per TP over (model, TP, ((batch, ms), ...)) rows (ms → s)."""
    by_tp: dict[int, list[tuple[float, float]]] = {}
    for _, tp, pts in rows:
        by_tp.setdefault(int(tp), []).extend((float(b), float(ms)) for b, ms in pts)
    fits, worst = {}, 0.0
    for tp, pts in sorted(by_tp.items()):
        x = np.array([p[0] for p in pts])
        y = np.array([p[1] for p in pts])
        if len(pts) < 2 or np.ptp(x) == 0:
            raise ValueError(f"TP {tp}: need at least two distinct batch sizes to fit, got {len(pts)} rows")
        if (y <= 0).any():
            raise ValueError(f"TP {tp}: overheads must be > 0 ms")
        c, a = np.polyfit(x, y, 1)
        a, c = max(float(a), 0.0), max(float(c), 0.0)
        worst = max(worst, float(np.max(np.abs(a + c * x - y) / y)))
        fits[tp] = (a * 1e-3, c * 1e-3)
    return IterationOverhead(fits, source=source, max_rel_error=worst)


VIDUR_A100_OVERHEAD = fit_overhead()
