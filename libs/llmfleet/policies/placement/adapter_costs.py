"""What LoRA adapters cost a placement: the adapter pool's memory on each base's instance and the
batched LoRA computation of each step, priced by :mod:`llmfleet.costmodel.lora`, the functions the
simulator and the emulated engines charge.

* **Memory** (:class:`InstanceMemory`): an engine with LoRA on (``GpuPool.adapter_slots`` > 0) reserves
  an adapter pool beside every base it hosts, ``adapter_slots · adapter size at max_lora_rank``
  (:func:`~llmfleet.costmodel.lora.adapter_pool_bytes`, as the native and emulated engines and the
  simulator's pool layout reserve it), whether or not its adapters have traffic; the KV pool shrinks by
  that much. A planner's memory fit charges it with the weights.
* **Computation** (:class:`AdapterTraffic`, :func:`with_lora`): a base whose services name adapters
  runs a decode batch of ``b`` rows with ``b · share`` adapter rows (``share``: the adapters' part of
  the base's request rate) over ``min(adapters, slots, rows)`` distinct adapters, each step paying
  :meth:`LoraCost.batch_seconds <llmfleet.costmodel.lora.LoraCost.batch_seconds>` at ``max_lora_rank``
  (the pool pads every adapter to it). Loads of adapters into slots are not priced here: they depend on
  dispatch's affinity, which the plan evaluator simulates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llmfleet.costmodel.hardware import Hardware, hardware
from llmfleet.costmodel.lora import LoraCost, adapter_pool_bytes
from llmfleet.costmodel.memory import DEFAULT_MEM_FRACTION, engine_kv_bytes, merged_block_bytes
from llmfleet.costmodel.models import ModelArch
from llmfleet.engine_core.limits import EngineLimits
from llmfleet.kvblocks.pool import watermark_blocks
from llmfleet.policies.placement.base import GpuPool, ServiceLoad

IterationTime = Callable[[int, float, float], float]
"""(n_gpus, batch, mean_context_tokens) -> seconds per decode iteration."""


@dataclass(frozen=True)
class InstanceMemory:
    """What an instance of the pool's GPUs holds besides KV: each model's weights, peak activations
    and, with LoRA on, its adapter pool (see the module docstring), under the engines' ``limits`` and
    ``mem_fraction`` (:class:`~llmfleet.policies.placement.base.GpuPool`)."""

    hw: Hardware
    adapter_slots: int = 0
    max_lora_rank: int = 16
    limits: EngineLimits = field(default_factory=EngineLimits)
    mem_fraction: float = DEFAULT_MEM_FRACTION
    kv_override: int | None = None  # GpuPool.kv_bytes

    @classmethod
    def of(cls, gpus: GpuPool) -> InstanceMemory:
        return cls(
            hardware(gpus.hardware), gpus.adapter_slots, gpus.max_lora_rank, gpus.limits, gpus.mem_fraction,
            gpus.kv_bytes,
        )  # fmt: skip

    def pool_bytes(self, arch: ModelArch) -> int:
        """The adapter pool reserved beside ``arch`` (0 with LoRA off)."""
        return adapter_pool_bytes(arch, self.adapter_slots, self.max_lora_rank)

    def fixed_bytes(self, archs: Sequence[ModelArch]) -> int:
        """Weights plus adapter pools of ``archs`` on one instance."""
        return sum(a.weight_bytes + self.pool_bytes(a) for a in archs)

    def kv_bytes(self, tp: int, archs: Sequence[ModelArch]) -> int:
        """The KV pool a ``tp``-GPU instance hosting ``archs`` keeps, as the simulator's pool layout and
        the emulated engines size it: ``mem_fraction`` of its GPUs less weights, peak activations (at
        the limits' batch sizes) and adapter pools (≤ 0: they do not fit); the pool's ``kv_bytes``
        when it sets one, as the simulator's engines then keep."""
        if self.kv_override is not None:
            return self.kv_override
        return engine_kv_bytes(
            self.hw, tp, archs, self.mem_fraction, self.limits.max_prefill_tokens,
            self.limits.max_batch_requests, self.adapter_slots, self.max_lora_rank,
        )  # fmt: skip

    def holds_longest(self, tp: int, archs: Sequence[ModelArch]) -> bool:
        """Whether that pool admits one sequence of each model at its longest context, as the engine's
        allocator counts it under the limits: merged blocks of ``block_tokens`` tokens of the largest
        model, less the watermark's blocks. This is vLLM's start-up rule (``max_model_len`` must fit the
        KV cache)."""
        kv = self.kv_bytes(tp, archs)
        if kv <= 0:
            return False
        block_bytes = merged_block_bytes(archs, self.limits.block_tokens)
        blocks = kv // block_bytes
        usable = blocks - watermark_blocks(blocks, self.limits.watermark)
        return all(-(-a.max_context // a.kv_shape.tokens_per_block(block_bytes)) <= usable for a in archs)


@dataclass(frozen=True)
class AdapterTraffic:
    """A base model's adapter demand: ``adapters`` distinct adapters with traffic and ``share`` of the
    base's requests that name one of them."""

    adapters: int
    share: float

    def __post_init__(self) -> None:
        if self.adapters < 0 or not 0.0 <= self.share <= 1.0:
            raise ValueError(f"AdapterTraffic needs adapters >= 0 and share in [0, 1], got {self}")


def adapter_traffic(services: Sequence[ServiceLoad]) -> dict[str, AdapterTraffic]:
    """Per base model whose services name LoRA adapters: how many adapters and which share of its
    requests (by rate; by service count when none of its services has traffic)."""
    by_model: dict[str, list[ServiceLoad]] = {}
    for s in services:
        by_model.setdefault(s.model, []).append(s)
    out: dict[str, AdapterTraffic] = {}
    for m, svcs in by_model.items():
        if not any(s.adapter for s in svcs):
            continue
        total = sum(s.rate_rps for s in svcs)
        busy = [s for s in svcs if s.rate_rps > 0] if total > 0 else svcs
        weight = {id(s): (s.rate_rps if total > 0 else 1.0) for s in busy}
        share = sum(weight[id(s)] for s in busy if s.adapter) / sum(weight.values())
        out[m] = AdapterTraffic(len({s.adapter for s in busy if s.adapter}), min(share, 1.0))
    return out


def lora_step_seconds(
    arch: ModelArch, memory: InstanceMemory, traffic: AdapterTraffic, tp: int, rows: float
) -> float:
    """The LoRA seconds a decode step of ``rows`` rows of ``arch`` pays on ``tp`` GPUs (0 with LoRA off
    or without adapter rows)."""
    adapter_rows = rows * traffic.share
    if memory.adapter_slots <= 0 or adapter_rows <= 0 or traffic.adapters <= 0:
        return 0.0
    distinct = min(traffic.adapters, memory.adapter_slots, math.ceil(adapter_rows))
    return LoraCost(arch, memory.hw, tp, memory.max_lora_rank).batch_seconds(adapter_rows, distinct)


def with_lora(
    it: IterationTime, arch: ModelArch, memory: InstanceMemory, traffic: AdapterTraffic
) -> IterationTime:
    """``it`` plus the LoRA computation of each decode iteration (:func:`lora_step_seconds`)."""
    return lambda n, batch, ctx: it(n, batch, ctx) + lora_step_seconds(arch, memory, traffic, n, batch)
