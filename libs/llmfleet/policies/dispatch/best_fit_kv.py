"""Best-fit dispatch by free KV memory: the tightest engine that still holds the request's KV.

Need = ``request.kv_need_bytes`` ((prompt + predicted output) · KV bytes per token), 0 without a
request. An engine fits when it reports a KV capacity (``kv_capacity_bytes > 0``) and its free KV
``kv_free_bytes >= need``. Among fitting engines the one with the LEAST free KV wins (bin-packing best
fit: keeps large holes for large requests); if none fits, the one with the MOST free KV (the best chance
to fit once memory frees up; engines of unknown capacity count as 0 free). Ties by engine id.
Stateless and deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from llmfleet.policies.dispatch.base import DispatchNeeds, DispatchRequest, EngineCandidate, eligible


class BestFitKv:
    """Least free KV that fits the request's need, else most free KV; ties by engine id."""

    name = "best_fit_kv"
    # free KV and the request's predicted need: the scheduler asks the profiler, the simulator keeps
    # kv_used_bytes exact (no fast-forward)
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(reads_kv=True, reads_predictions=True)

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        pool = eligible(model, candidates, exclude)
        return best_fit(pool, request.kv_need_bytes if request is not None else 0)


def best_fit(pool: Sequence[EngineCandidate], need: int) -> str:
    """The engine of ``pool`` (non-empty) with the least free KV that holds ``need``, else the one
    with the most free KV; the first (smallest id) of ties."""
    fits = [c for c in pool if c.kv_capacity_bytes > 0 and c.kv_free_bytes >= need]
    if fits:
        return min(fits, key=lambda c: c.kv_free_bytes).engine_id
    return min(pool, key=lambda c: -c.kv_free_bytes).engine_id
