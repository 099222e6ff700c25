"""The engine's memory plan: one budget for weights, peak activations and the unified KV pool.

Every loaded model reserves its weights plus an estimate of its peak activation; everything else in
the budget is KV pool (SeaLLM: "weights and peak activation reserved per model, the rest of memory is
one pool"). The pool is one tensor of ``num_blocks`` blocks; a model's reservation is held as blocks
of that pool under the pseudo-model ``__reserved__``, so loading a model shrinks the KV capacity by
exactly its footprint and unloading gives it back. On CPU the pool tensor is allocated lazily by the
OS (untouched pages cost nothing); on CUDA set ``memory_budget_bytes`` with the weights in mind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from llmfleet.kvblocks import BlockAllocator
from llmfleet.kvblocks.shapes import KvShape

RESERVED_MODEL = "__reserved__"
CPU_BUDGET_CAP = 4 << 30


def device_memory_bytes(device: str) -> int:
    """Total memory of ``device``: the GPU's memory for CUDA devices, physical RAM otherwise."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def default_budget(device: str) -> int:
    """90% of a GPU; a quarter of RAM (at most 4 GiB) on CPU."""
    total = device_memory_bytes(device)
    if torch.device(device).type == "cuda":
        return int(0.9 * total)
    return min(total // 4, CPU_BUDGET_CAP)


def reserved_shape(block_bytes: int) -> KvShape:
    """A pseudo KV shape whose token is exactly one block, for holding reservations in the pool."""
    if block_bytes % 8:
        raise ValueError(f"block_bytes must be a multiple of 8, got {block_bytes}")
    return KvShape(num_layers=1, num_kv_heads=1, head_dim=block_bytes // 8, dtype="float32")


def peak_activation_bytes(
    config: object, dtype_bytes: int, max_batch_tokens: int, max_batch_requests: int
) -> int:
    """Estimate of one forward's peak activation: per token the residual stream, q/k/v/o, the MLP's
    gate/up/down intermediates (in the weights' dtype), plus float32 logits for the sampled rows."""
    hidden = int(getattr(config, "hidden_size", 0))
    inter = int(getattr(config, "intermediate_size", 4 * hidden))
    vocab = int(getattr(config, "vocab_size", 0))
    per_token = (6 * hidden + 3 * inter) * dtype_bytes
    return max_batch_tokens * per_token + max_batch_requests * vocab * 4


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: int
    block_bytes: int

    @property
    def num_blocks(self) -> int:
        return self.budget_bytes // self.block_bytes

    def blocks_for_bytes(self, nbytes: int) -> int:
        return -(-nbytes // self.block_bytes)


@dataclass(frozen=True, eq=False)
class KvPool:
    """The unified pool the executor's parts share: its device, plan, block allocator and K/V tensors."""

    device: str
    plan: MemoryPlan
    allocator: BlockAllocator
    storage: Any  # KvStorage (native), or the emulated engine's NoKvStorage
