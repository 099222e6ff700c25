"""Shared least-squares fitting for the cost-model forms (all are linear in their coefficients).

Constraint policy (used by every form in this package): all coefficients are bounded ≥ 0. Each is a
time or byte count per unit of work (tokens, batch, context, devices) or a fixed overhead; a negative
slope would make derived limits such as Aladdin's l_d(b) non-monotone, and a negative intercept would
predict negative time for small batches (which unconstrained fits produce when the true curve bends,
e.g. memory-bound short prompts). ``nonneg`` stays per-coefficient for callers that need otherwise.

Columns are scaled to unit norm before solving (token counts ~1e4 against seconds ~1e-2), which keeps
the bounded solvers well conditioned; positive scaling preserves the ≥ 0 bounds. Too few points, a
rank-deficient design (e.g. all x equal) or non-finite data raise :class:`FitError` — never NaN.

Loss (``relative``): by default ordinary least squares, min Σ(ŷ − y)². With ``relative=True`` the
residuals are divided by the measurement, min Σ((ŷ − y)/y)² — weighted least squares with weights
1/y², which is the maximum-likelihood fit when timing noise is proportional to the time (it is on
CPUs: a step's jitter grows with its length) and the natural loss when a model is judged by relative
error. Plain least squares lets the few long points dominate and leaves sub-millisecond points with
errors of 20–40% on the CPU engine; the relative loss trades a little absolute error on the long
points for a much smaller worst-case relative error. It needs every y > 0 (:class:`FitError`
otherwise). The forms and their ≥ 0 bounds are the same either way; only the weights differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class FitError(ValueError):
    """The data cannot determine the coefficients (too few points, degenerate design, non-finite)."""


@dataclass(frozen=True)
class FitReport:
    """Quality of a fit on its own points; ``rmse_s`` is in the target's unit (seconds, or bytes for KV)."""

    rmse_s: float
    max_rel_error: float
    n_points: int
    params: dict[str, float]

    def to_dict(self) -> dict:
        return {
            "rmse_s": self.rmse_s,
            "max_rel_error": self.max_rel_error,
            "n_points": self.n_points,
            "params": dict(self.params),
        }

    @classmethod
    def from_dict(cls, d: dict) -> FitReport:
        return cls(float(d["rmse_s"]), float(d["max_rel_error"]), int(d["n_points"]), dict(d["params"]))


def _validate(design: np.ndarray, y: np.ndarray, names: Sequence[str], what: str) -> None:
    n, p = design.shape
    if len(names) != p:
        raise ValueError(f"{len(names)} names for {p} columns")
    if n < p:
        raise FitError(f"{what}: {n} points cannot determine {p} coefficients {list(names)}; need ≥ {p}")
    if not (np.all(np.isfinite(design)) and np.all(np.isfinite(y))):
        raise FitError(f"{what}: samples contain NaN or infinity")
    if np.linalg.matrix_rank(design) < p:
        raise FitError(
            f"{what}: degenerate samples, {list(names)} are not separately identifiable "
            "(vary every input, e.g. more than one distinct batch size and length)"
        )


def _report(design: np.ndarray, y: np.ndarray, coef: np.ndarray, names: Sequence[str]) -> FitReport:
    pred = design @ coef
    err = pred - y
    rel = np.abs(err) / np.maximum(np.abs(y), np.finfo(float).tiny)
    return FitReport(
        rmse_s=float(np.sqrt(np.mean(err**2))),
        max_rel_error=float(np.max(rel)),
        n_points=len(y),
        params={k: float(v) for k, v in zip(names, coef, strict=True)},
    )


def _prepare(
    design: Sequence[Sequence[float]], y: Sequence[float], names: Sequence[str], what: str, relative: bool
):
    """Validated arrays, the row weights (1/y when ``relative``, else 1) and the column scales of the
    weighted design."""
    a = np.asarray(design, dtype=float)
    b = np.asarray(y, dtype=float)
    if a.ndim != 2 or b.ndim != 1 or a.shape[0] != b.shape[0]:
        if a.size == 0:
            raise FitError(f"{what}: no samples")
        raise ValueError(f"{what}: design {a.shape} does not match targets {b.shape}")
    _validate(a, b, names, what)
    if relative:
        if np.any(b <= 0):
            raise FitError(f"{what}: a relative-error fit needs every measurement > 0")
        w = 1.0 / b
    else:
        w = np.ones_like(b)
    scale = np.linalg.norm(a * w[:, None], axis=0)
    return a, b, w, scale


def fit_linear(
    design: Sequence[Sequence[float]],
    y: Sequence[float],
    names: Sequence[str],
    nonneg: Sequence[bool],
    what: str = "fit",
    *,
    relative: bool = False,
) -> tuple[dict[str, float], FitReport]:
    """min ‖W(design·θ − y)‖² with θ_i ≥ 0 where ``nonneg[i]`` (scipy ``lsq_linear``); W = I, or
    diag(1/y) with ``relative`` (see the module docstring)."""
    a, b, w, scale = _prepare(design, y, names, what, relative)
    lower = np.where(np.asarray(nonneg, dtype=bool), 0.0, -np.inf)
    from scipy.optimize import lsq_linear  # scipy.optimize takes ~1 s to import: only where a fit runs

    res = lsq_linear(
        a * w[:, None] / scale, b * w, bounds=(lower, np.full(len(names), np.inf)), method="bvls"
    )
    coef = res.x / scale
    report = _report(a, b, coef, names)
    return report.params, report


def fit_curve(
    design: Sequence[Sequence[float]],
    y: Sequence[float],
    names: Sequence[str],
    nonneg: Sequence[bool],
    what: str = "fit",
    *,
    relative: bool = False,
) -> tuple[dict[str, float], FitReport]:
    """Same problem as :func:`fit_linear`, solved by ``scipy.optimize.curve_fit`` (as SCLS §4 does);
    ``relative`` passes ``sigma = y`` (curve_fit's per-point uncertainty), i.e. weights 1/y²."""
    a, b, w, scale = _prepare(design, y, names, what, relative)
    scaled = a / scale
    nn = np.asarray(nonneg, dtype=bool)
    lower = np.where(nn, 0.0, -np.inf)
    p0 = np.linalg.lstsq(scaled * w[:, None], b * w, rcond=None)[0]
    p0 = np.where(nn, np.maximum(p0, 1e-12), p0)  # start strictly inside the bounds

    def model(idx: np.ndarray, *theta: float) -> np.ndarray:
        return scaled[idx.astype(int)] @ np.asarray(theta)

    x = np.arange(len(b), dtype=float)
    from scipy.optimize import curve_fit

    theta, _ = curve_fit(
        model,
        x,
        b,
        p0=p0,
        sigma=1.0 / w,
        absolute_sigma=False,
        bounds=(lower, np.full(len(names), np.inf)),
    )
    coef = np.asarray(theta) / scale
    if not np.all(np.isfinite(coef)):
        raise FitError(f"{what}: solver returned non-finite coefficients")
    report = _report(a, b, coef, names)
    return report.params, report


def min_max_rel_error(design: Sequence[Sequence[float]], y: Sequence[float], nonneg: Sequence[bool]) -> float:
    """The smallest maximum relative error any coefficients can reach on these points (a bound, not a
    fit): min t subject to |design·θ − y| ≤ t·y, θ_i ≥ 0 where ``nonneg[i]`` — a linear program
    (``scipy.optimize.linprog``). When it exceeds a target, no choice of coefficients — by any loss —
    meets the target with this form on these measurements. Needs every y > 0."""
    names = [f"θ{i}" for i in range(len(nonneg))]
    a, _, w, scale = _prepare(design, y, names, "min-max bound", True)
    aw = a * w[:, None] / scale  # rows divided by y: the constraints read |aw·φ − 1| ≤ t
    n, k = aw.shape
    ones = np.ones((n, 1))
    from scipy.optimize import linprog

    res = linprog(
        c=np.r_[np.zeros(k), 1.0],
        A_ub=np.vstack([np.hstack([aw, -ones]), np.hstack([-aw, -ones])]),
        b_ub=np.r_[np.ones(n), -np.ones(n)],
        bounds=[(0.0, None) if nn else (None, None) for nn in nonneg] + [(0.0, None)],
        method="highs",
    )
    if not res.success:  # pragma: no cover - the problem is always feasible (θ = 0, t = 1)
        raise FitError(f"min-max bound: {res.message}")
    return float(res.x[-1])
