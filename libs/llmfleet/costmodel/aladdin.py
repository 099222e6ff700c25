"""Aladdin's performance models (Aladdin §4, "performance modeling") and their fits from profiles.

- KV per request:         kv = h·(l_in + l_out) + j
- Prefill batch time:     t_pre = k1·Σ l_in + c1            (only total tokens matter)
- Decode iteration time:  t_d = (k2·l_ave + c2)·b + c3
- Decode context limit:   l_d(b) = (T_dec − c3 − c2·b)/k2   (the *sum* of context lengths in the batch)
- Tensor parallel:        t_compute = k4/N + c4,  t_comm = k_comm·(N − 1)/N
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from llmfleet.costmodel.fit import FitReport, fit_linear


@dataclass(frozen=True)
class PrefillModel:
    """t_pre = k1·Σl_in + c1 (seconds)."""

    k1: float
    c1: float

    def predict(self, total_tokens: float) -> float:
        return self.k1 * total_tokens + self.c1

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class DecodeModel:
    """t_d = (k2·l_ave + c2)·b + c3 (seconds per iteration)."""

    k2: float
    c2: float
    c3: float

    def predict(self, batch: float, mean_context: float) -> float:
        return (self.k2 * mean_context + self.c2) * batch + self.c3

    def context_limit(self, batch: float, t_dec: float) -> float:
        """l_d(b) = (T_dec − c3 − c2·b)/k2: max Σ context over the batch with t_d ≤ T_dec, clamped at 0.

        With k2 = 0 the limit is infinite when the SLO holds at any context and 0 otherwise.
        """
        slack = t_dec - self.c3 - self.c2 * batch
        if slack <= 0:
            return 0.0
        return float("inf") if self.k2 <= 0 else slack / self.k2

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class KvModel:
    """kv = h·(l_in + l_out) + j (bytes; use the current sequence length)."""

    h: float
    j: float

    def predict(self, seq_len: float) -> float:
        return self.h * seq_len + self.j

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class TpModel:
    """t_compute = k4/N + c4, t_comm = k_comm·(N − 1)/N (seconds)."""

    k4: float
    c4: float
    k_comm: float

    def compute(self, n: int) -> float:
        return self.k4 / n + self.c4

    def comm(self, n: int) -> float:
        return self.k_comm * (n - 1) / n

    def predict(self, n: int) -> float:
        return self.compute(n) + self.comm(n)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class AladdinModel:
    """Prefill + decode forms behind the latency interface shared with ``RooflineModel``."""

    prefill: PrefillModel
    decode: DecodeModel
    source: str = "fitted"

    def prefill_time(self, total_tokens: float) -> float:
        return self.prefill.predict(total_tokens)

    def decode_time(self, batch: float, mean_context: float) -> float:
        return self.decode.predict(batch, mean_context)


def fit_prefill(
    samples: Sequence[tuple[float, float]], *, relative: bool = False
) -> tuple[PrefillModel, FitReport]:
    """Fit k1, c1 ≥ 0 from ``(total_tokens, seconds)`` samples (``relative``: weights 1/y², see fit.py)."""
    design = [[t, 1.0] for t, _ in samples]
    y = [s for _, s in samples]
    p, rep = fit_linear(design, y, ["k1", "c1"], [True, True], "aladdin prefill", relative=relative)
    return PrefillModel(**p), rep


def fit_decode(
    samples: Sequence[tuple[float, float, float]], *, relative: bool = False
) -> tuple[DecodeModel, FitReport]:
    """Fit k2, c2, c3 ≥ 0 from ``(batch, mean_context, seconds)`` samples (``relative``: weights 1/y²)."""
    design = [[b * lav, b, 1.0] for b, lav, _ in samples]
    y = [s for *_, s in samples]
    names = ["k2", "c2", "c3"]
    p, rep = fit_linear(design, y, names, [True, True, True], "aladdin decode", relative=relative)
    return DecodeModel(**p), rep


def fit_kv(samples: Sequence[tuple[float, float]]) -> tuple[KvModel, FitReport]:
    """Fit h, j ≥ 0 from ``(seq_len = l_in + l_out, kv_bytes)`` samples."""
    design = [[n, 1.0] for n, _ in samples]
    p, rep = fit_linear(design, [kv for _, kv in samples], ["h", "j"], [True, True], "aladdin kv")
    return KvModel(**p), rep


def fit_tp(samples: Sequence[tuple[int, float, float]]) -> tuple[TpModel, FitReport]:
    """Fit k4, c4, k_comm ≥ 0 from ``(N, compute_seconds, comm_seconds)`` samples.

    Compute and communication must be measured apart: 1/N, 1 and (N−1)/N are linearly dependent, so
    their sum alone cannot identify the three coefficients. The report is on total time.
    """
    design, y = [], []
    for n, comp, comm in samples:
        design += [[1.0 / n, 1.0, 0.0], [0.0, 0.0, (n - 1) / n]]
        y += [comp, comm]
    names = ["k4", "c4", "k_comm"]
    p, _ = fit_linear(design, y, names, [True, True, True], "aladdin tensor parallel")
    model = TpModel(**p)
    totals = [comp + comm for _, comp, comm in samples]
    preds = [model.predict(n) for n, *_ in samples]
    errs = [pr - t for pr, t in zip(preds, totals, strict=True)]
    rep = FitReport(
        rmse_s=(sum(e * e for e in errs) / len(errs)) ** 0.5,
        max_rel_error=max(abs(e) / max(abs(t), 1e-300) for e, t in zip(errs, totals, strict=True)),
        n_points=len(samples),
        params=p,
    )
    return model, rep
