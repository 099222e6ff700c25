"""Mell dispatch: send an arrival where Mell's Allocate would put it (Mell §VI-C, Fig. 10).

Allocate places a request by its KV size *now* (prompt tokens × KV bytes per token; not the predicted
end size), using the packer's GPU types and activation order: a T request beside an L request with room,
else on the most recent T-GPU with room; an S/M request as the one S/M of an L-GPU (S_L + S_i < C), else
on the most recent GPU of its class with room; an L request (or one nothing takes) on an idle engine,
which opens it. The types come from a :class:`MellView` (``view_source``: the simulator passes the
packer's ``view``, the live scheduler a reader of the view the coordinator publishes). The engines'
requests are not known here, so a busy candidate is taken as one item of its used KV bytes: its type
comes from the view, fits from its free KV, and among L-GPUs with room the one with the most idle memory
wins (Mell ranks fewer requests first; the packer accepts any L-GPU with room, so nothing moves for it).
With no view (or one that knows no capacity yet), or no engine that fits, it falls back to best fit by
free KV. Ties by engine id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from llmfleet.policies.dispatch.base import DispatchNeeds, DispatchRequest, EngineCandidate, eligible
from llmfleet.policies.dispatch.best_fit_kv import best_fit
from llmfleet.policies.migration.base import GpuState, RequestState
from llmfleet.policies.migration.mell import MellView, allocate_target


class MellDispatch:
    """Where Mell's Allocate would put the request (see the module docstring); else best fit by free KV."""

    name = "mell"
    # free KV, and running counts (whether an engine is busy); the size is the prompt's KV now, so no
    # predicted output length
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(reads_queue=True, reads_kv=True)

    def __init__(self, view_source: Callable[[], MellView | None] | None = None) -> None:
        self.view_source = view_source

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        pool = eligible(model, candidates, exclude)
        size = request.prompt_tokens * request.kv_bytes_per_token if request is not None else 0
        view = self.view_source() if self.view_source is not None else None
        if view is not None and view.capacity_bytes > 0:
            target = allocate_target(view, [_as_gpu(c, model, view) for c in pool], model, size)
            if target is not None:
                return target
        return best_fit(pool, size)


def _as_gpu(c: EngineCandidate, model: str, view: MellView) -> GpuState:
    """A candidate as a Mell GPU: empty, or one item of its used KV bytes plus what its queued
    prompts will take (a queue is KV already promised)."""
    used = c.kv_used_bytes + c.kv_waiting_bytes
    busy = c.running > 0 or c.waiting > 0 or used > 0
    reqs = (RequestState("~used", model, used),) if busy else ()
    return GpuState(
        c.engine_id, c.models, c.kv_capacity_bytes, reqs, active=busy or c.engine_id in view.by_id
    )
