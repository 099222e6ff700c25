"""Fit every latency form from the engine's raw Profile samples ``(phase, batch_size, tokens, seconds)``.

Kept apart from ``fit.py`` because it depends on the forms in ``aladdin`` and ``scls``, which depend on
``fit`` for the solver (the import graph must stay acyclic).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llmfleet.costmodel.aladdin import DecodeModel, PrefillModel, fit_decode, fit_prefill
from llmfleet.costmodel.fit import FitError, FitReport, min_max_rel_error
from llmfleet.costmodel.scls import SclsDecode, SclsPrefill, fit_scls_decode, fit_scls_prefill


@dataclass(frozen=True)
class EngineProfileFit:
    """Fitted Aladdin and SCLS forms; ``reports`` keyed ``aladdin.prefill``, ``scls.decode`` ..."""

    aladdin_prefill: PrefillModel
    aladdin_decode: DecodeModel
    scls_prefill: SclsPrefill
    scls_decode: SclsDecode
    reports: dict[str, FitReport]


def _unpack(sample: Any) -> tuple[str, int, int, float]:
    if isinstance(sample, tuple | list):
        phase, batch, tokens, seconds = sample
    else:  # the engine's ProfileSample or anything with the same attributes
        phase, batch, tokens, seconds = sample.phase, sample.batch_size, sample.tokens, sample.seconds
    if phase not in ("prefill", "decode"):
        raise FitError(f"unknown profile phase {phase!r}; expected 'prefill' or 'decode'")
    return phase, int(batch), int(tokens), float(seconds)


def median_per_point(samples: Iterable[Any]) -> list[tuple[str, int, int, float]]:
    """Collapse repeated measurements of one (phase, batch, tokens) point to their median: timing noise
    on a shared machine is one-sided (interference only adds time), and the median discards it."""
    groups: dict[tuple[str, int, int], list[float]] = {}
    for s in samples:
        phase, b, t, sec = _unpack(s)
        groups.setdefault((phase, b, t), []).append(sec)
    return [(p, b, t, statistics.median(v)) for (p, b, t), v in sorted(groups.items())]


def fit_engine_profile(
    samples: Iterable[Any], *, aggregate: bool = True, relative: bool = True
) -> EngineProfileFit:
    """Aladdin: prefill on total tokens = batch·tokens, decode with l_ave = tokens.
    SCLS: prefill T(N = batch, L = tokens), decode τ(l = tokens, N = batch).
    With ``aggregate`` (default) repeats of a point are reduced to their median before fitting, and
    the reports' errors are over those points. ``relative`` (default) fits by relative error (weights
    1/y², see ``fit.py``): profile points span two orders of magnitude (a 1-token step against a
    batch of 8 × 256 tokens) and the fits are judged and used by relative error; ``relative=False``
    is plain least squares.
    """
    pre: list[tuple[int, int, float]] = []
    dec: list[tuple[int, int, float]] = []
    for phase, b, t, sec in median_per_point(samples) if aggregate else map(_unpack, samples):
        (pre if phase == "prefill" else dec).append((b, t, sec))
    a_pre, r1 = fit_prefill([(b * t, sec) for b, t, sec in pre], relative=relative)
    a_dec, r2 = fit_decode(dec, relative=relative)
    s_pre, r3 = fit_scls_prefill(pre, relative=relative)
    s_dec, r4 = fit_scls_decode(dec, relative=relative)
    reports = {"aladdin.prefill": r1, "aladdin.decode": r2, "scls.prefill": r3, "scls.decode": r4}
    return EngineProfileFit(a_pre, a_dec, s_pre, s_dec, reports)


def min_max_bounds(samples: Iterable[Any], *, aggregate: bool = True) -> dict[str, float]:
    """For each form of :func:`fit_engine_profile` (same keys, same points), the smallest maximum
    relative error that any non-negative coefficients reach (``fit.min_max_rel_error``): how close the
    form itself can come to the measurements, whatever the loss."""
    pre: list[tuple[int, int, float]] = []
    dec: list[tuple[int, int, float]] = []
    for phase, b, t, sec in median_per_point(samples) if aggregate else map(_unpack, samples):
        (pre if phase == "prefill" else dec).append((b, t, sec))
    designs = {
        "aladdin.prefill": ([[b * t, 1.0] for b, t, _ in pre], pre),
        "aladdin.decode": ([[b * t, b, 1.0] for b, t, _ in dec], dec),
        "scls.prefill": ([[n * ln, n, ln, 1.0] for n, ln, _ in pre], pre),
        "scls.decode": ([[n * ln, n, ln, 1.0] for n, ln, _ in dec], dec),
    }
    return {
        form: min_max_rel_error(design, [s for *_, s in pts], [True] * len(design[0]))
        for form, (design, pts) in designs.items()
    }
