"""Aladdin best-fit's options record (:class:`~.aladdin_bestfit.AladdinBestFit`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Constraints = Literal["strict", "paper", "strict_d"]
OnInfeasible = Literal["least_loaded", "open"]


@dataclass(frozen=True)
class AladdinBestFitOptions:
    """Aladdin best-fit's options. The policy needs ``latency_models`` and ``slos``; where it runs they
    come from the dispatch context unless given here.

    Args:
        latency_models: model -> object with ``.prefill.predict(tokens)`` and ``.decode.predict(b, l)``,
            ``.decode.context_limit(b, T_dec)`` (``AladdinModel`` or ``RooflineModel``).
        slos: model -> (T_pre, T_dec) seconds, or an object/mapping with ``ttft_s``/``tpot_s``.
        kv_capacity_tokens: M per worker in tokens (a number or model -> number). Else
            ``kv_capacity_bytes`` (number or per model) ÷ ``kv_bytes_per_token`` (number or per model;
            else the request's ``kv_bytes_per_token``). Else each engine's reported
            ``kv_capacity_bytes`` ÷ bytes per token. Else unbounded (constraint (e) off).
        gamma: γ of (b), the "strictness knob" (paper: 0.5).
        theta: θ of (b) and (d), margin for prediction error, 0 < θ ≤ 1 (default 0.9: the paper only
            says 0 < θ < 1; 0.9 leaves 10 % headroom, about the decode-model error it reports, < 5 %,
            doubled).
        predictor: ``LengthPredictor`` or callable ``f(service, prompt_tokens, generated) -> tokens``,
            for re-prediction and for requests that arrive without a prediction.
        default_output_tokens: prediction when the request has none and there is no predictor.
        prefill_window_s: window over which (b)'s prefill load ρ (the share of time a worker spends in
            the prefills placed on it) is measured.
        constraints: ``"strict"`` ((b) at T_dec·(1 − ρ), (d) with t_d(b + 1)), ``"paper"`` (Eq. 4 as
            printed) or ``"strict_d"`` ((b) as printed, (d) with t_d(b + 1): strict's two changes one at
            a time); see the policy's module docstring.
        on_infeasible: ``"least_loaded"`` or ``"open"`` (the paper's: open a new worker).
        protect: check (d) (default); False drops it, to measure what it costs (the Aladdin sweep's
            ``no-(d)`` configuration).
        protect_prefills: (d) also protects the requests placed on a worker whose prefill has not
            ended (default): with one-phase engines a prefill placed after theirs runs before their
            second token, so the worker's slack is at most T_dec. False protects only requests that
            have produced a token (the earlier behaviour, kept to measure the difference).
        heartbeat_s: the scheduling heartbeat (0: each request is placed when it arrives). The paper's
            MIP places the requests that arrived "between the scheduling heartbeat" together: callers
            dispatch a request at the first multiple of ``heartbeat_s`` at or after its arrival, in
            arrival order, with that time as ``now`` (its TTFT still counts from its arrival).
    """

    latency_models: Mapping[str, Any] | None = None
    slos: Mapping[str, Any] | None = None
    kv_capacity_tokens: float | Mapping[str, float] | None = None
    kv_capacity_bytes: float | Mapping[str, float] | None = None
    kv_bytes_per_token: float | Mapping[str, float] | None = None
    gamma: float = 0.5
    theta: float = 0.9
    predictor: Any = None
    default_output_tokens: float = 256.0
    prefill_window_s: float = 10.0
    constraints: Constraints = "strict"
    on_infeasible: OnInfeasible = "least_loaded"
    protect: bool = True
    protect_prefills: bool = True
    heartbeat_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.heartbeat_s) and self.heartbeat_s >= 0):
            raise ValueError(f"heartbeat_s must be finite and >= 0, got {self.heartbeat_s!r}")
        if self.constraints not in ("strict", "paper", "strict_d"):
            raise ValueError(f"constraints must be 'strict', 'paper' or 'strict_d', got {self.constraints!r}")
        if self.on_infeasible not in ("least_loaded", "open"):
            raise ValueError(f"on_infeasible must be 'least_loaded' or 'open', got {self.on_infeasible!r}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not 0 < self.theta <= 1:
            raise ValueError(f"theta must be in (0, 1], got {self.theta}")
        p = self.predictor
        if p is not None and not (hasattr(p, "predict") or callable(p)):
            raise ValueError("predictor must be a LengthPredictor or a callable")
        if self.prefill_window_s <= 0:
            raise ValueError(f"prefill_window_s must be > 0, got {self.prefill_window_s}")
