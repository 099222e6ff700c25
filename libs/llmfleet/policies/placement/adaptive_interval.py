"""SeaLLM's adaptive replacement interval (§4.3, Eq. 8).

    I_{t+1} = (1 − β)·I_t   if |M_real − M_est| / M_est > β
              (1 + β)·I_t   otherwise

M_est is what the simulator predicted for the interval that just ended (the chosen plan's score on the
previous interval's history), M_real what the service monitor measured over it.

M combines the two metrics the paper names into one number: **M = SLO attainment / normalized
latency** (both over the interval's requests). Then ln M = ln A − ln L_N, so the relative deviation
|M_real − M_est|/M_est is, to first order, the relative deviation of the attainment minus that of the
normalized latency: a drop in attainment or a rise in latency by β each shortens the interval, and
both moving the same way (the workload got uniformly heavier) counts once. M is 0 when no request met
its SLO; when M_est is 0 the deviation is 0 if M_real is also 0, else infinite (shorten).

Resolutions: the interval is clamped to [``min_s``, ``max_s``]; the paper says (1 + β) when the
deviation is below β and leaves "equal" open — equal counts as stable (lengthen). An interval with no
measurement (no finished request, or no estimate) keeps I_t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def performance(slo_attainment: float, normalized_latency: float) -> float:
    """M = attainment / normalized latency (see the module docstring); ValueError on bad input."""
    if not 0 <= slo_attainment <= 1:
        raise ValueError(f"SLO attainment must be in [0, 1], got {slo_attainment}")
    if not normalized_latency > 0 or not math.isfinite(normalized_latency):
        raise ValueError(f"normalized latency must be a positive number, got {normalized_latency}")
    return slo_attainment / normalized_latency


def deviation(m_real: float, m_est: float) -> float:
    """|M_real − M_est| / M_est (0/0 → 0, x/0 → inf)."""
    if m_est == 0:
        return 0.0 if m_real == 0 else math.inf
    return abs(m_real - m_est) / m_est


@dataclass
class AdaptiveInterval:
    """Eq. 8 with β (paper: 0.1) from an initial interval I_0 (a hyper-parameter, paper: the operator's)."""

    initial_s: float = 60.0
    beta: float = 0.1
    min_s: float = 1.0
    max_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 < self.beta < 1:
            raise ValueError(f"beta must be in (0, 1), got {self.beta}")
        if not 0 < self.min_s <= self.initial_s <= self.max_s:
            raise ValueError(
                f"need 0 < min_s <= initial_s <= max_s, got {self.min_s}, {self.initial_s}, {self.max_s}"
            )
        self.interval_s = float(self.initial_s)
        self.history: list[tuple[float, float | None, float | None]] = []  # (interval, M_real, M_est)

    def next_interval(self, m_real: float | None, m_est: float | None) -> float:
        """Advance to I_{t+1} from the last interval's measured and estimated M; returns it."""
        self.history.append((self.interval_s, m_real, m_est))
        if m_real is None or m_est is None:
            return self.interval_s
        factor = 1 - self.beta if deviation(m_real, m_est) > self.beta else 1 + self.beta
        self.interval_s = min(self.max_s, max(self.min_s, self.interval_s * factor))
        return self.interval_s
