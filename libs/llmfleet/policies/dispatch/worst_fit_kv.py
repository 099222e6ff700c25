"""Worst-fit dispatch by free KV memory: the engine with the MOST free KV bytes.

Free KV = ``kv_capacity_bytes - kv_used_bytes`` (0 when the capacity is unknown). Spreads requests to
where the largest hole is (bin-packing worst fit); the request's own need does not change the choice
(the largest hole fits it if any does). Ties by engine id. Stateless and deterministic.

``active_only=True`` is the worst fit of bin packing as Mell's baselines use it: among the *active*
engines (holding KV or queued prompts) the one with the most free KV that holds the request's prompt
KV now; an idle engine is opened (the lowest id) only when no active one fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from llmfleet.policies.dispatch.base import DispatchNeeds, DispatchRequest, EngineCandidate, eligible


@dataclass(frozen=True)
class WorstFitKvOptions:
    """``active_only``: worst fit among the active engines, an idle one opened only when none fits
    (see the module docstring)."""

    active_only: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.active_only, bool):
            raise ValueError(f"active_only must be a bool, got {self.active_only!r}")


class WorstFitKv:
    """Most free KV bytes; ties by engine id."""

    name = "worst_fit_kv"
    # free KV: the simulator keeps it exact (no fast-forward)
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(reads_kv=True)
    Options: ClassVar[type[WorstFitKvOptions]] = WorstFitKvOptions

    def __init__(self, options: WorstFitKvOptions | None = None) -> None:
        self.active_only = (options if options is not None else WorstFitKvOptions()).active_only

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        pool = eligible(model, candidates, exclude)
        if self.active_only:
            need = request.prompt_tokens * request.kv_bytes_per_token if request is not None else 0
            active = [c for c in pool if c.kv_used_bytes + c.kv_waiting_bytes > 0]
            fits = [c for c in active if c.kv_free_bytes - c.kv_waiting_bytes >= need]
            if fits:
                return min(fits, key=lambda c: -(c.kv_free_bytes - c.kv_waiting_bytes)).engine_id
            idle = [c for c in pool if c.kv_used_bytes + c.kv_waiting_bytes == 0]
            if idle:
                return idle[0].engine_id
        return min(pool, key=lambda c: -c.kv_free_bytes).engine_id  # first (smallest id) of ties
