"""Colocate all: every instance hosts ALL models, sharing one KV pool (AlpaServe-like baseline).

The opposite extreme of a dedicated split: each instance holds the weights of every distinct model
among the services (names sorted), so any instance can serve any request and the KV cache is shared
(AlpaServe, Li et al., OSDI 2023, motivates colocating models to multiplex bursty load).

* TP degree: the smallest power of two ``<= gpus_per_node`` whose group memory
  (``hardware.mem_bytes × tp``) holds the summed weights with at least ``MIN_KV_FRACTION`` (0.1) of
  it left for KV (:func:`~llmfleet.policies.placement.dedicated_even.smallest_tp`); with LoRA on
  (``GpuPool.adapter_slots``) each model's adapter pool counts with its weights
  (:class:`~llmfleet.policies.placement.adapter_costs.InstanceMemory`).
* Instances: ``count // tp``, ids ``"colocate-{i}"``; GPUs left over by the division stay idle.

Raises :class:`PlacementInfeasible` when the summed weights fit no TP group within a node, or when the pool has fewer GPUs than ``tp``. No services -> no instances.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.costmodel.models import model_arch
from llmfleet.policies.placement.adapter_costs import InstanceMemory
from llmfleet.policies.placement.base import (
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementInfeasible,
    PlacementNeeds,
    PlannerReport,
    ServiceLoad,
)
from llmfleet.policies.placement.dedicated_even import GIB, MIN_KV_FRACTION, pool_note, smallest_tp


class ColocateAll(PlannerReport):
    """Every instance hosts every model; TP fits the summed weights (or is given)."""

    name = "colocate_all"
    needs = PlacementNeeds()

    def place(
        self, gpus: GpuPool, services: Sequence[ServiceLoad], context: PlacementContext | None = None
    ) -> list[InstancePlan]:
        memory = InstanceMemory.of(gpus)
        hw = memory.hw
        models = tuple(sorted({s.model for s in services}))
        if not models:
            return []
        archs = [model_arch(m) for m in models]
        weights = memory.fixed_bytes(archs)
        pools = sum(memory.pool_bytes(a) for a in archs)
        what = f"{len(models)} models ({weights / GIB:.1f} GiB of weights{pool_note(pools)})"
        tp = smallest_tp(weights, hw.mem_bytes, gpus.gpus_per_node, MIN_KV_FRACTION)
        if tp is None:
            raise PlacementInfeasible(
                f"{what} {', '.join(models)} do not fit {gpus.gpus_per_node} {hw.name} GPUs of a node "
                f"with {MIN_KV_FRACTION:.0%} left for KV"
            )
        if gpus.count < tp:
            raise PlacementInfeasible(f"{what} need tp={tp} but the pool has {gpus.count} GPUs")
        return [InstancePlan(f"colocate-{i}", models, tp) for i in range(gpus.count // tp)]
