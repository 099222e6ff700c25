"""What LoRA adapters cost on top of their base model: the rank-r matmuls of a batch's adapter rows, the
adapter pool's memory, and loading an adapter into a slot.

An adapter of rank ``r`` adds, on each target Linear ``[in → out]`` of every layer, ``A [r, in]`` and
``B [out, r]``; the targets are the seven projections of a llama layer (q, k, v, o, gate, up, down),
what the native engine serves (``llmfleet_engine.lora``). Per layer that is ``r · P`` weights, with
``P = Σ_targets (in + out)`` (:func:`lora_params_per_rank`).

**A batch** (:meth:`LoraCost.batch_seconds`), for the ``tokens`` rows that name an adapter and the
``adapters`` distinct adapters among them, as punica / S-LoRA's batched kernels run it (the shrink
``x·A`` and the expand ``(x·A)·B`` over each row's own adapter):

* FLOPs ``2 · tokens · r · P · layers`` (two matmuls, a multiply-add each), at the hardware's
  attainable FLOP/s;
* bytes ``adapters · r · P · layers · dtype`` (each adapter's weights read once per step), at its
  attainable memory bandwidth;
* time = max(compute, memory) over the ``tp`` GPUs (the weights and the rows' work split evenly) plus
  ``KERNEL_S`` per layer (one fused shrink and one fused expand launch per layer, all targets at
  once). Rows without an adapter add nothing.

**Loading** (:meth:`LoraCost.load_seconds`): the adapter's bytes (``r · P · layers · dtype``) over
the host-to-device link, each GPU its ``1/tp`` share (``Hardware.h2d_bytes_per_s``: PCIe Gen4 x16,
32 GB/s, on the A100s), plus ``LOAD_OVERHEAD_S`` (the engine's bookkeeping, allocation and the
copy's launch). The adapter is assumed in host memory already (the native engine reads it from disk
when it is registered, not when it is loaded); reading it from disk is not charged.

**Memory** (:func:`adapter_pool_bytes`): the pool's weights, ``max_loras · max_lora_rank · P ·
layers · dtype``, reserved next to the base's weights (the native engine's ``pool_bytes``); the KV pool
shrinks by that much.

Assumptions (stated, not measured on a GPU here): ``KERNEL_S`` = 10 µs per layer (two launches of
about 5 µs, punica's BGMV shrink/expand); ``LOAD_OVERHEAD_S`` = 2 ms per load (vLLM's LRU adapter
cache reports loads of a cached adapter in the low milliseconds); the efficiencies are the
hardware's (``compute_eff``, ``mem_eff``), as for the base model's steps. For Llama-2-7B at rank 16
on one A100-80GB: an adapter is 76 MiB, loads in 4.5 ms, and a decode step of 64 adapter rows over
8 adapters adds about 0.7 ms (a base step of that batch takes 15-20 ms).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmfleet.costmodel.hardware import Hardware
from llmfleet.costmodel.models import ModelArch

KERNEL_S = 10e-6  # per layer with adapter rows in the step: one shrink + one expand launch
LOAD_OVERHEAD_S = 2e-3  # per adapter load, on top of the copy
DEFAULT_RANK = 16
_DECLARED_RANK = re.compile(r"emulated://r(\d+)/?")


def declared_rank(adapter: str | None) -> int | None:
    """The rank an adapter entry declares without files (``adapter: emulated://rN``, what emulated
    engines and the simulator serve), else None (a directory: its files say)."""
    m = _DECLARED_RANK.fullmatch(adapter or "")
    return int(m.group(1)) if m else None


def lora_params_per_rank(arch: ModelArch) -> int:
    """``P``: Σ over one layer's seven target projections of ``in + out`` (weights per unit of rank)."""
    h, f = arch.hidden_size, arch.ffn_size
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    attn = (h + q) + 2 * (h + kv) + (q + h)  # q, k, v, o
    mlp = (3 if arch.gated_mlp else 2) * (h + f)  # gate, up, down (or fc1, fc2)
    return attn + mlp


def adapter_bytes(arch: ModelArch, rank: int = DEFAULT_RANK) -> int:
    """One adapter's weights: ``r · P · layers · dtype`` bytes."""
    return rank * lora_params_per_rank(arch) * arch.num_layers * arch.dtype_bytes


def adapter_pool_bytes(arch: ModelArch, max_loras: int, max_rank: int = DEFAULT_RANK) -> int:
    """The adapter pool's weights on a base (``max_loras`` slots of rank up to ``max_rank``)."""
    return max_loras * adapter_bytes(arch, max_rank) if max_loras > 0 else 0


@dataclass(frozen=True)
class LoraCost:
    """LoRA's extra time on ``arch`` over a ``tp``-GPU instance of ``hw`` (see the module docstring)."""

    arch: ModelArch
    hw: Hardware
    tp: int = 1
    rank: int = DEFAULT_RANK

    def batch_seconds(self, tokens: float, adapters: int) -> float:
        """Extra seconds of a step whose ``tokens`` rows (prefill tokens and decodes) name one of
        ``adapters`` distinct adapters; 0 without adapter rows (a planner passes a mean, fractional
        row count)."""
        if tokens <= 0 or adapters <= 0:
            return 0.0
        a = self.arch
        weights = self.rank * lora_params_per_rank(a) * a.num_layers
        compute = 2.0 * tokens * weights / (self.tp * self.hw.flops)
        memory = adapters * weights * a.dtype_bytes / (self.tp * self.hw.bandwidth)
        return max(compute, memory) + a.num_layers * KERNEL_S

    def load_seconds(self, rank: int | None = None) -> float:
        """Seconds to copy one adapter of ``rank`` (None: the pool's) from host memory into a slot."""
        size = adapter_bytes(self.arch, self.rank if rank is None else rank)
        return size / (self.tp * self.hw.h2d_bytes_per_s) + LOAD_OVERHEAD_S
