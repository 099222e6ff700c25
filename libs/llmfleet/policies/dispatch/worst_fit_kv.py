"""Worst-fit dispatch by free KV memory: the engine with the MOST free KV bytes.

Free KV = ``kv_capacity_bytes - kv_used_bytes`` (0 when the capacity is unknown). Spreads requests to
where the largest hole is (bin-packing worst fit); the request's own need does not change the choice
(the largest hole fits it if any does). Ties by engine id. Stateless and deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.policies.dispatch.base import DispatchNeeds, DispatchRequest, EngineCandidate, eligible


class WorstFitKv:
    """Most free KV bytes; ties by engine id."""

    name = "worst_fit_kv"
    needs = DispatchNeeds(reads_kv=True)  # free KV: the simulator keeps it exact (no fast-forward)

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        del request
        pool = eligible(model, candidates, exclude)
        return min(pool, key=lambda c: -c.kv_free_bytes).engine_id  # first (smallest id) of ties
