"""Dedicated even split: every model gets an equal share of the GPUs and its own instances (vLLM-style).

The usual "one vLLM deployment per model" baseline of multi-LLM serving papers (AlpaServe, MuxServe):

* GPUs per model: the distinct models among the services each get ``count // n_models`` GPUs; the
  ``count % n_models`` leftovers go one each to the models with the highest request rate (summed over
  their services), ties by model name.
* TP degree: the smallest power of two ``tp <= gpus_per_node`` whose group memory
  (``hardware.mem_bytes × tp``) holds the weights with at least ``MIN_KV_FRACTION`` of it left for the
  KV cache (:func:`smallest_tp`). 0.1 keeps 10 % of the group's memory for KV — enough to
  serve, not a tuned value. With LoRA on (``GpuPool.adapter_slots``) the adapter pool the engine
  reserves beside the base counts with its weights
  (:class:`~llmfleet.policies.placement.adapter_costs.InstanceMemory`).
* Instances: ``gpus_for_model // tp`` instances of that model alone, ids ``"{model}-{i}"`` (i from 0);
  GPUs left over by the division stay idle. Output: models by name, then instance index.

Raises :class:`PlacementInfeasible` naming the model when its weights need more than one node, or its
share is smaller than its TP degree (it would get no instance). No services -> no instances.
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

GIB = 1 << 30


MIN_KV_FRACTION = 0.1  # the share of a TP group's memory the placements keep free of weights, for KV


def pool_note(pool_bytes: int) -> str:
    """`` (a 0.59 GiB LoRA adapter pool included)`` for an error naming memory; "" without a pool."""
    return f" (a {pool_bytes / GIB:.2f} GiB LoRA adapter pool included)" if pool_bytes else ""


def fits_tp(weight_bytes: float, mem_bytes: float, tp: int, min_kv_fraction: float) -> bool:
    """Whether ``tp`` GPUs of ``mem_bytes`` each hold the weights with ``min_kv_fraction`` left for KV."""
    return weight_bytes <= (1 - min_kv_fraction) * mem_bytes * tp


def smallest_tp(
    weight_bytes: float, mem_bytes: float, gpus_per_node: int, min_kv_fraction: float
) -> int | None:
    """The smallest power of two ``tp <= gpus_per_node`` that :func:`fits_tp`; None when none does."""
    tp = 1
    while tp <= gpus_per_node:
        if fits_tp(weight_bytes, mem_bytes, tp, min_kv_fraction):
            return tp
        tp *= 2
    return None


class DedicatedEven(PlannerReport):
    """Equal GPU share per model (leftovers by request rate), smallest fitting TP, one model per instance."""

    name = "dedicated_even"
    needs = PlacementNeeds()

    def place(
        self, gpus: GpuPool, services: Sequence[ServiceLoad], context: PlacementContext | None = None
    ) -> list[InstancePlan]:
        memory = InstanceMemory.of(gpus)
        hw = memory.hw
        rate: dict[str, float] = {}
        for s in services:
            rate[s.model] = rate.get(s.model, 0.0) + s.rate_rps
        if not rate:
            return []
        base, extra = divmod(gpus.count, len(rate))
        by_rate = sorted(rate, key=lambda m: (-rate[m], m))
        share = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_rate)}
        plans: list[InstancePlan] = []
        for m in sorted(rate):
            arch = model_arch(m)
            fixed = memory.fixed_bytes([arch])
            tp = smallest_tp(fixed, hw.mem_bytes, gpus.gpus_per_node, MIN_KV_FRACTION)
            if tp is None:
                raise PlacementInfeasible(
                    f"model {m!r}: {fixed / GIB:.1f} GiB of weights{pool_note(memory.pool_bytes(arch))} do "
                    f"not fit {gpus.gpus_per_node} {hw.name} GPUs of a node with {MIN_KV_FRACTION:.0%} left for KV"
                )
            if share[m] < tp:
                raise PlacementInfeasible(
                    f"model {m!r} gets {share[m]} of {gpus.count} GPUs ({len(rate)} models) "
                    f"but needs tp={tp} on {hw.name}"
                )
            plans += [InstancePlan(f"{m}-{i}", (m,), tp) for i in range(share[m] // tp)]
        return plans
