"""KV pool arithmetic shared by the simulator (``llmfleet.sim.memory``) and the planners that size
workers by their KV capacity (Aladdin's M, ``policies.placement.aladdin_workers``).

pool = tp · mem_bytes · mem_fraction − Σ_m (weights_m + activation_m), with the activation estimate
activation_m = max_prefill_tokens · (4·h + 2·f) · dtype_bytes + max_batch_requests · vocab · 4 (hidden
states, attention/MLP intermediates of one prefill chunk, fp32 logits of a decode batch). The defaults
are the engine's (``EngineSettings``: gpu_memory_utilization 0.9, max_num_batched_tokens 8192,
max_num_seqs 256), so a planner that passes nothing sizes M as the simulated pool.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.costmodel.hardware import Hardware
from llmfleet.costmodel.lora import adapter_pool_bytes
from llmfleet.costmodel.models import ModelArch

DEFAULT_MEM_FRACTION = 0.9
DEFAULT_MAX_PREFILL_TOKENS = 8192
DEFAULT_MAX_BATCH_REQUESTS = 256


def merged_block_bytes(archs: Sequence[ModelArch], block_tokens: int) -> int:
    """Bytes of one merged KV block of a unified pool hosting ``archs``: ``block_tokens`` tokens of the
    model with the most KV per token (the others fit ``block_bytes // their bytes per token``)."""
    return block_tokens * max(a.kv_bytes_per_token for a in archs)


def activation_bytes(
    arch: ModelArch,
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
    max_batch_requests: int = DEFAULT_MAX_BATCH_REQUESTS,
) -> int:
    """Peak activation memory reserved next to the weights of ``arch``."""
    per_token = (4 * arch.hidden_size + 2 * arch.ffn_size) * arch.dtype_bytes
    return max_prefill_tokens * per_token + max_batch_requests * arch.vocab_size * 4


def kv_pool_bytes(
    hw: Hardware,
    tp: int,
    archs: Sequence[ModelArch],
    mem_fraction: float = DEFAULT_MEM_FRACTION,
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
    max_batch_requests: int = DEFAULT_MAX_BATCH_REQUESTS,
) -> int:
    """KV bytes of an instance of ``tp`` GPUs hosting ``archs`` (≤ 0: they do not fit)."""
    total = int(tp * hw.mem_bytes * mem_fraction)
    reserved = sum(
        a.weight_bytes + activation_bytes(a, max_prefill_tokens, max_batch_requests) for a in archs
    )
    return total - reserved


def engine_kv_bytes(
    hw: Hardware,
    tp: int,
    archs: Sequence[ModelArch],
    mem_fraction: float,
    max_prefill_tokens: int,
    max_batch_requests: int,
    adapter_slots: int = 0,
    max_lora_rank: int = 16,
) -> int:
    """The KV pool an engine keeps: :func:`kv_pool_bytes` less the LoRA adapter pool it reserves
    beside each model (``adapter_slots`` of rank ``max_lora_rank``; 0 slots: LoRA off). The simulator's
    pool layout and the planners' memory fit both size it here."""
    kv = kv_pool_bytes(hw, tp, archs, mem_fraction, max_prefill_tokens, max_batch_requests)
    return kv - sum(adapter_pool_bytes(a, adapter_slots, max_lora_rank) for a in archs)


def load_seconds(archs: Sequence[ModelArch], hw: Hardware, tp: int) -> float:
    """Seconds to load ``archs``' weights onto a ``tp``-GPU instance: each GPU pulls its 1/tp shard
    over its own host link (``Hardware.h2d_bytes_per_s``). The simulator and the emulated engine charge it."""
    return sum(a.weight_bytes for a in archs) / (tp * hw.h2d_bytes_per_s)
