"""The native executor's knobs (:class:`ExecutorConfig`): the shared engine limits plus the node's own."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.engine_core import EngineLimits
from llmfleet.engine_core.core import DEFAULT_PREEMPTION
from llmfleet.policies.request.preemption import PreemptionRule
from llmfleet.spec.defaults import ENGINE_POLICY


@dataclass(frozen=True)
class ExecutorConfig(EngineLimits):
    """Executor knobs: the shared :class:`EngineLimits` (CPU-friendly defaults) plus the node's own
    (see docs/engine.md for how they interact)."""

    max_batch_requests: int = 32
    max_prefill_tokens: int = 4096
    block_bytes: int | None = 64 * 1024  # one merged block (all layers x KV heads x T_m tokens of a model)
    device: str = "cpu"
    cache_dir: str | Path | None = None
    memory_budget_bytes: int | None = None  # weights + activations + KV pool; None: default_budget()
    # local policy: a request policy, or a static batcher (see make_engine_policy)
    policy: str = ENGINE_POLICY
    options: dict[str, Any] = field(default_factory=dict)  # the local policy's constructor options
    max_waiting: int = 4096
    num_threads: int | None = None
    throughput_window_s: float = 10.0
    allow_download: bool = True
    stream_interval_s: float = 0.005  # wake consumers at most this often (first/final chunks at once)
    max_loras: int = 0  # LoRA adapter slots per base model (0: LoRA off, the layers run as loaded)
    max_lora_rank: int = 16  # the largest adapter rank a slot holds
    preemption: PreemptionRule | None = DEFAULT_PREEMPTION  # the core's rule (None: KV shortage only)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_bytes is None:
            raise ValueError("the live executor needs block_bytes")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.throughput_window_s <= 0:
            raise ValueError(f"throughput_window_s must be > 0, got {self.throughput_window_s}")
        if self.max_loras < 0 or self.max_lora_rank < 1:
            raise ValueError(
                f"max_loras >= 0 and max_lora_rank >= 1; got {self.max_loras}, {self.max_lora_rank}"
            )
        if self.stream_interval_s < 0:
            raise ValueError(f"stream_interval_s must be >= 0, got {self.stream_interval_s}")
