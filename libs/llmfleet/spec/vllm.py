"""``engines.<id>.vllm``: the settings of an engine whose ``backend`` is ``vllm``.

One record, read in three places: the cluster file (``llmfleet up`` passes it to the engine as
``--vllm-options JSON``), the engine's ``--vllm-options`` flag (checked by the same model) and the vLLM
backend, which turns it into ``AsyncEngineArgs`` (one vLLM engine per loaded model).

Memory: on CPU, ``kv_cache_memory_bytes`` sizes each model's KV cache (what ``VLLM_CPU_KVCACHE_SPACE``
does, per engine); unset, vLLM takes its CPU default. On CUDA, ``gpu_memory_utilization`` is the GPU
fraction all of the node's vLLM engines use together, split evenly over ``max_models`` (a vLLM engine
cannot grow or shrink after it starts); ``kv_cache_memory_bytes``, when set, fixes the KV cache of each
engine instead, as vLLM's own argument does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmfleet.spec.sizes import ByteSize

VLLM_DTYPES = ("auto", "float16", "bfloat16", "float32")
VllmDtype = Literal["auto", "float16", "bfloat16", "float32"]
# vLLM's scheduling policies: fcfs (arrival order) or priority (each request's priority, then arrival)
SchedulingPolicy = Literal["fcfs", "priority"]
# AsyncEngineArgs fields the named settings set: engine_args may not set them a second time
_NAMED = {
    "max_model_len": "max_model_len",
    "enforce_eager": "enforce_eager",
    "dtype": "dtype",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "enable_prefix_caching": "enable_prefix_caching",
    "max_num_seqs": "max_num_seqs",
    "scheduling_policy": "scheduling_policy",
    "model": "the model's source (models:)",
    "tensor_parallel_size": "the engine's tp",
    "enable_lora": "the engine's max_loras",
    "max_loras": "the engine's max_loras",
    "max_lora_rank": "the engine's max_lora_rank",
}


class VllmSettings(BaseModel):
    """A vLLM engine's settings (a misspelt key is an error naming it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # KV cache of each model's vLLM engine (vLLM's kv_cache_memory_bytes; "1GiB" accepted)
    kv_cache_memory_bytes: ByteSize | None = Field(None, gt=0)
    # CUDA: the GPU fraction all models of the node use together (split evenly over max_models)
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    max_model_len: int | None = Field(None, ge=1)  # unset: the checkpoint's context
    enforce_eager: bool = False  # no torch.compile / CUDA graphs (faster start, slower steps)
    dtype: VllmDtype = "auto"  # auto: the model entry's dtype, else the checkpoint's
    max_models: int = Field(1, ge=1)  # vLLM engines (models) one node runs at once
    enable_prefix_caching: bool = True  # vLLM's automatic prefix caching (its V1 default)
    max_num_seqs: int | None = Field(None, ge=1)  # requests per step (vLLM's default when unset)
    # priority: vLLM runs (and preempts for) each request's priority, the one the scheduler resolved
    # (llmfleet's higher-first, passed to vLLM negated: vLLM runs the lower value first); fcfs: arrival order
    scheduling_policy: SchedulingPolicy = "fcfs"
    # further AsyncEngineArgs fields, passed as they are (vLLM rejects an unknown one at load)
    engine_args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("engine_args")
    @classmethod
    def _not_named(cls, v: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(k for k in v if k in _NAMED)
        if taken:
            where = ", ".join(f"{k} ({_NAMED[k]})" for k in taken)
            raise ValueError(f"engine_args may not set what a named setting sets: {where}")
        return v
