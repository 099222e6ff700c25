"""The vLLM backend's configuration and what it makes of it: per-model engine arguments, dtype and
memory share."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKEND = "vllm"
VLLM_DTYPES = ("auto", "float16", "bfloat16", "float32")
MEMORY_ACCOUNTING = ("auto", "per_instance", "cumulative")


@dataclass
class VllmConfig:
    """Knobs of the vLLM backend.

    ``gpu_memory_utilization`` is the fraction of GPU memory all of this executor's engines may use
    together; each model gets an equal share of it, ``gpu_memory_utilization / max_models`` (vLLM
    engines cannot grow or shrink after start-up, so the split is fixed). ``dtype`` other than
    ``"auto"`` forces that dtype for every model; with ``"auto"`` a spec asking for float16/bfloat16
    gets it and one asking for float32 (``ModelSpec``'s default, i.e. unspecified) gets vLLM's
    ``"auto"`` (the checkpoint dtype, with float32 checkpoints run in float16). The GPU is chosen with
    ``CUDA_VISIBLE_DEVICES``; ``device`` must be ``"cuda"`` (or ``"cuda:0"``).
    ``extra_engine_args`` are passed to ``AsyncEngineArgs`` as they are (e.g. ``max_num_seqs``).
    """

    device: str = "cuda"
    cache_dir: str | Path | None = None
    gpu_memory_utilization: float = 0.85
    max_models: int = 2
    max_model_len: int | None = None
    enforce_eager: bool = False
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    allow_download: bool = True
    max_requests: int = 4096
    log_stats: bool = False
    memory_accounting: str = "auto"
    throughput_window_s: float = 10.0
    shutdown_timeout_s: float = 30.0
    extra_engine_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_models < 1:
            raise ValueError(f"max_models must be >= 1, got {self.max_models}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.dtype not in VLLM_DTYPES:
            raise ValueError(f"dtype must be one of {VLLM_DTYPES}, got {self.dtype!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")
        if self.memory_accounting not in MEMORY_ACCOUNTING:
            raise ValueError(
                f"memory_accounting must be one of {MEMORY_ACCOUNTING}, got {self.memory_accounting!r}"
            )
        if self.throughput_window_s <= 0:
            raise ValueError(f"throughput_window_s must be > 0, got {self.throughput_window_s}")
        if not re.fullmatch(r"cuda(:0)?", self.device):
            raise ValueError(
                f"device must be 'cuda' for the vLLM backend, got {self.device!r}; "
                "pick the GPU with CUDA_VISIBLE_DEVICES"
            )


def engine_dtype(spec_dtype: str | None, configured: str = "auto") -> str:
    """The vLLM ``dtype`` for a model spec: a configured dtype wins; float32 (unspecified) -> auto."""
    if configured != "auto":
        return configured
    if spec_dtype in ("float16", "bfloat16"):
        return spec_dtype
    return "auto"


def engine_memory_fraction(total: float, max_models: int, loaded: int, cumulative: bool) -> float:
    """``gpu_memory_utilization`` for the next engine when ``loaded`` engines already run."""
    share = total / max_models
    if cumulative:
        return min(total, share * (loaded + 1))
    return share


def engine_kwargs(config: VllmConfig, model: str, dtype: str, memory_fraction: float) -> dict[str, Any]:
    """Keyword arguments for ``AsyncEngineArgs`` (filter them with ``supported_kwargs``)."""
    kwargs: dict[str, Any] = {
        "model": model,
        "tokenizer": model,
        "dtype": dtype,
        "gpu_memory_utilization": round(memory_fraction, 4),
        "enforce_eager": config.enforce_eager,
        "tensor_parallel_size": config.tensor_parallel_size,
        "disable_log_stats": not config.log_stats,
        "disable_log_requests": True,  # up to ~0.10
        "enable_log_requests": False,  # later versions
    }
    if config.max_model_len is not None:
        kwargs["max_model_len"] = config.max_model_len
    kwargs.update(config.extra_engine_args)
    return kwargs
