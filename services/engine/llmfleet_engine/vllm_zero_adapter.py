"""The zero LoRA adapter that base requests carry on vLLM's CPU build.

vLLM's CPU LoRA kernels (``vllm.lora.ops.torch_ops``: ``bgmv_shrink`` / ``bgmv_expand``) pick each
token's adapter weights with ``weights[token_lora_indices]``, and a token without an adapter has index
-1, which picks the *last* adapter slot: once that slot holds an adapter, the base's rows of a batch
get that adapter's delta (vLLM's GPU kernels skip -1). So on CPU a base request of a LoRA engine
carries a LoRA request too, for an adapter whose weights are zero (rank 1 on one projection; vLLM
zeroes the projections an adapter leaves out): its rows add exactly zero, and no row has index -1.
The engine gets one more vLLM slot for it (``max_loras + 1``) so the adapters keep their ``max_loras``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig
from safetensors.torch import save_file

from llmfleet_engine.lora.adapter import WEIGHTS_FILE
from llmfleet_engine.lora.pool import DEFAULT_TARGETS

ZERO_LORA_ID = 2**31 - 1  # its vLLM id on every base's engine (one engine per base): no adapter's
ZERO_LORA_NAME = "llmfleet-zero"


def write_zero_adapter(skeleton: torch.nn.Module, directory: Path) -> Path:
    """Writes a PEFT adapter of ``skeleton`` (the base on the meta device) with zero weights into
    ``directory``: rank 1 on the first of the LoRA targets the base has."""
    module = next(
        (n, m)
        for n, m in skeleton.named_modules()
        if n.rsplit(".", 1)[-1] in DEFAULT_TARGETS and isinstance(m, torch.nn.Linear)
    )
    name, linear = module
    directory.mkdir(parents=True, exist_ok=True)
    LoraConfig(r=1, lora_alpha=1, target_modules=[name.rsplit(".", 1)[-1]]).save_pretrained(str(directory))
    key = f"base_model.model.{name}"
    save_file(
        {
            f"{key}.lora_A.weight": torch.zeros(1, linear.in_features),
            f"{key}.lora_B.weight": torch.zeros(linear.out_features, 1),
        },
        str(directory / WEIGHTS_FILE),
    )
    return directory
