"""KV pool sizing of a simulated instance (weights and peak activation reserved, the rest is KV;
the arithmetic lives in :mod:`llmfleet.costmodel.memory`, shared with Aladdin's worker sizing).

pool = tp · mem_bytes · mem_fraction − Σ_m (weights_m + activation_m), with the activation estimate
activation_m = max_prefill_tokens · (4·h + 2·f) · dtype_bytes + max_batch_requests · vocab · 4 (hidden states,
attention/MLP intermediates of one prefill chunk, fp32 logits of a decode batch). Merged blocks
(SeaLLM §5): ``block_bytes = block_tokens · max_m kv_bytes_per_token_m`` so the largest model gets
``block_tokens`` tokens per block and the others more. With LoRA on (``max_loras``), each model's
adapter pool (:func:`llmfleet.costmodel.lora.adapter_pool_bytes`) is reserved too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmfleet.costmodel import Hardware, ModelArch
from llmfleet.costmodel import memory as _mem
from llmfleet.sim.spec import EngineSettings


class DoesNotFit(ValueError):
    """The instance's models leave no room for KV."""


def activation_bytes(arch: ModelArch, eng: EngineSettings) -> int:
    return _mem.activation_bytes(arch, eng.max_prefill_tokens, eng.max_batch_requests)


@dataclass(frozen=True)
class PoolLayout:
    kv_bytes: int
    block_bytes: int

    @property
    def num_blocks(self) -> int:
        return self.kv_bytes // self.block_bytes


def pool_layout(hw: Hardware, tp: int, archs: Sequence[ModelArch], eng: EngineSettings) -> PoolLayout:
    block_bytes = _mem.merged_block_bytes(archs, eng.block_tokens)
    if eng.kv_bytes is not None:
        kv = eng.kv_bytes
    else:
        kv = _mem.engine_kv_bytes(
            hw, tp, archs, eng.mem_fraction, eng.max_prefill_tokens, eng.max_batch_requests,
            eng.max_loras, eng.max_lora_rank,
        )  # fmt: skip
    if kv < block_bytes:
        names = ", ".join(a.name for a in archs)
        raise DoesNotFit(
            f"{names} on {tp}×{hw.name}: weights + activations leave {max(kv, 0) / 2**30:.2f} GiB for KV, "
            f"less than one block ({block_bytes / 2**20:.1f} MiB); use a larger TP degree"
        )
    return PoolLayout(kv, block_bytes)
