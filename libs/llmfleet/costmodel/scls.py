"""SCLS's slice estimators (SCLS §4.2 time, §4.3 memory) and their ``curve_fit`` fits.

- T_prefill(N, L) = p1·N·L + p2·N + p3·L + p4
- τ_decode(l, N)  = d1·N·l + d2·N + d3·l + d4
- T_serve(N, L_i, S) = T_prefill(N, L_i) + Σ_{l=1..S} τ_decode(L_i + l, N)
                     = T_prefill + S·(d1·N·L_i + d2·N + d3·L_i + d4) + (d1·N + d3)·S(S+1)/2
- N_max = ⌊ζ·(M_cap − M_model − M_engine) / (Δ·(L_i + S))⌋
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from llmfleet.costmodel.fit import FitReport, fit_curve


@dataclass(frozen=True)
class SclsPrefill:
    """T = p1·N·L + p2·N + p3·L + p4 (N sequences padded to length L)."""

    p1: float
    p2: float
    p3: float
    p4: float

    def predict(self, n: float, length: float) -> float:
        return self.p1 * n * length + self.p2 * n + self.p3 * length + self.p4

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class SclsDecode:
    """τ(l, N) = d1·N·l + d2·N + d3·l + d4: one iteration of N sequences at context l."""

    d1: float
    d2: float
    d3: float
    d4: float

    def predict(self, n: float, context: float) -> float:
        return self.d1 * n * context + self.d2 * n + self.d3 * context + self.d4

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class SclsModel:
    """Prefill + decode estimators and the slice time T_serve."""

    prefill: SclsPrefill
    decode: SclsDecode

    def t_serve_sum(self, n: int, l_in: int, s: int) -> float:
        """T_prefill(N, L_i) + Σ_{l=1..S} τ(L_i + l, N), summed explicitly."""
        return self.prefill.predict(n, l_in) + sum(self.decode.predict(n, l_in + k) for k in range(1, s + 1))

    def t_serve(self, n: int, l_in: int, s: int) -> float:
        """Closed form: T_prefill + S·τ(L_i, N) + (d1·N + d3)·S(S+1)/2."""
        d = self.decode
        return self.prefill.predict(n, l_in) + s * d.predict(n, l_in) + (d.d1 * n + d.d3) * s * (s + 1) / 2


def n_max(
    m_cap: float, m_model: float, m_engine: float, l_in: int, s: int, delta: float, zeta: float = 0.9
) -> int:
    """N_max = ⌊ζ(M_cap − M_model − M_engine) / (Δ(L_i + S))⌋, at least 0 (Δ = KV bytes per token)."""
    if delta <= 0 or l_in + s <= 0:
        raise ValueError(f"need delta > 0 and L_i + S > 0, got delta={delta}, L_i+S={l_in + s}")
    available = zeta * (m_cap - m_model - m_engine)
    return max(0, math.floor(available / (delta * (l_in + s))))


def fit_scls_prefill(
    samples: Sequence[tuple[float, float, float]], *, relative: bool = False
) -> tuple[SclsPrefill, FitReport]:
    """Fit p1..p4 ≥ 0 from ``(N, L, seconds)`` samples (``relative``: weights 1/y²)."""
    design = [[n * ln, n, ln, 1.0] for n, ln, _ in samples]
    y = [s for *_, s in samples]
    names = ["p1", "p2", "p3", "p4"]
    p, rep = fit_curve(design, y, names, [True] * 4, "scls prefill", relative=relative)
    return SclsPrefill(**p), rep


def fit_scls_decode(
    samples: Sequence[tuple[float, float, float]], *, relative: bool = False
) -> tuple[SclsDecode, FitReport]:
    """Fit d1..d4 ≥ 0 from ``(N, context l, seconds)`` samples (``relative``: weights 1/y²)."""
    design = [[n * ln, n, ln, 1.0] for n, ln, _ in samples]
    y = [s for *_, s in samples]
    names = ["d1", "d2", "d3", "d4"]
    p, rep = fit_curve(design, y, names, [True] * 4, "scls decode", relative=relative)
    return SclsDecode(**p), rep
