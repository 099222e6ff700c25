"""vLLM version shims of the vLLM backend: everything that differs between vLLM (and transformers)
versions, and the lazy vLLM import. No vLLM needed to import this module.

vLLM API differences handled here (each branch names the versions it is for):

* engine class: ``vllm.engine.async_llm_engine.AsyncLLMEngine`` (V0 before 0.8; in 0.8-0.10 its
  ``from_engine_args`` returns the V1 ``AsyncLLM`` when ``VLLM_USE_V1``; an alias of ``AsyncLLM`` once
  V0 was removed), falling back to ``vllm.v1.engine.async_llm.AsyncLLM`` if that module is gone
  (:func:`import_vllm`);
* shutdown: V1 ``AsyncLLM.shutdown()``; V0 ``shutdown_background_loop()`` (+ executor shutdown)
  (:func:`shutdown_engine`);
* cancellation: V1 ``generate`` aborts on ``CancelledError``/``GeneratorExit`` itself, V0 does not on
  ``CancelledError``, so the adapter always calls ``engine.abort(request_id)`` too (a no-op when done)
  (:func:`abort_request`, :func:`close_output_stream`);
* engine/sampling keyword names that changed (``disable_log_requests`` -> ``enable_log_requests``)
  are filtered against the installed classes' fields (:func:`supported_kwargs`);
* ``gpu_memory_utilization`` is per engine instance in most versions but counted against all memory
  used by the process (cumulative) for in-process V0 engines from 0.6.4 on: see
  :func:`uses_cumulative_memory_accounting`;
* where a started engine keeps its model/cache config (:func:`engine_facts`), its queueing time
  (:func:`engine_queue_s`), the GPU's total memory (:func:`total_gpu_memory_bytes`) and the checkpoint
  dtype's attribute name in transformers (:func:`auto_dtype`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

INSTALL_HINT = "the vLLM backend needs `pip install -e .[vllm]` on a CUDA host"


class BackendUnavailable(RuntimeError):
    """The vLLM backend cannot run here (vLLM is not installed or fails to import)."""


@dataclass(frozen=True)
class VllmApi:
    """The installed vLLM's version and the classes the adapter uses."""

    version: str
    engine_cls: Any
    engine_args_cls: Any
    sampling_params_cls: Any
    v1_default: bool


def import_vllm() -> VllmApi:
    """Import the vLLM classes the adapter uses; ``BackendUnavailable`` when that fails."""
    try:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.sampling_params import SamplingParams

        try:  # V0 class (dispatching to V1 in 0.8-0.10) or, once V0 is gone, an alias of AsyncLLM
            from vllm.engine.async_llm_engine import AsyncLLMEngine as engine_cls
        except ImportError:
            from vllm.v1.engine.async_llm import AsyncLLM as engine_cls
    except Exception as e:  # ImportError, or CUDA/driver errors raised while importing
        raise BackendUnavailable(f"{INSTALL_HINT}: {type(e).__name__}: {e}") from e
    version = str(getattr(vllm, "__version__", "0"))
    return VllmApi(
        version=version,
        engine_cls=engine_cls,
        engine_args_cls=AsyncEngineArgs,
        sampling_params_cls=SamplingParams,
        v1_default=_v1_default(engine_cls, version),
    )


def _v1_default(engine_cls: Any, version: str) -> bool:
    """Whether ``engine_cls.from_engine_args`` will build a V1 engine (checked again after the build)."""
    if getattr(engine_cls, "__module__", "").startswith("vllm.v1"):
        return True
    try:
        import vllm.envs as envs

        if hasattr(envs, "VLLM_USE_V1"):
            return bool(envs.VLLM_USE_V1)
    except Exception:
        pass
    return parse_version(version) >= (0, 8)


def parse_version(version: str) -> tuple[int, ...]:
    """``"0.6.4.post1"`` -> ``(0, 6, 4)``; unparsable parts stop the tuple."""
    parts: list[int] = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(parts)


def uses_cumulative_memory_accounting(version: str, v1_engine: bool) -> bool:
    """Whether ``gpu_memory_utilization`` counts memory other engines of this process already use.

    V1 engines run their core in a separate process, so the fraction is per engine. 0.6.4 made it a
    limit on all GPU memory in use (vLLM issue #10451, from PR #9352); later fixes restored it per
    instance across processes but still measure all torch memory of the process (PR #10498), which
    matters for V0 engines, which run in this process: from 0.6.4 on the second engine's fraction has
    to include the first one's. Up to 0.6.3 it was per engine.
    """
    if v1_engine:
        return False
    return parse_version(version) >= (0, 6, 4)


# Keys that only some vLLM versions accept; others are passed as they are (vLLM raises if wrong).
OPTIONAL_KWARGS = frozenset(
    {"disable_log_requests", "enable_log_requests", "disable_log_stats", "detokenize", "skip_special_tokens"}
)


def accepted_fields(cls: Any) -> frozenset[str] | None:
    """Constructor keyword names of a dataclass, msgspec struct or plain class; None if unknown."""
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls) if f.init)
    struct_fields = getattr(cls, "__struct_fields__", None)
    if struct_fields is not None:
        return frozenset(struct_fields)
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(params)


def supported_kwargs(cls: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the optional keys that ``cls`` does not accept."""
    fields = accepted_fields(cls)
    if fields is None:
        return {k: v for k, v in kwargs.items() if k not in OPTIONAL_KWARGS}
    return {k: v for k, v in kwargs.items() if k in fields or k not in OPTIONAL_KWARGS}


@dataclass(frozen=True)
class EngineFacts:
    """What a started engine says about itself (each None when the installed vLLM does not say)."""

    v1: bool
    max_model_len: int | None
    dtype: str | None
    num_gpu_blocks: int | None
    block_size: int | None


def engine_facts(engine: Any) -> EngineFacts:
    """Read model/cache config from a started engine: V1 ``AsyncLLM`` keeps ``model_config`` and
    ``vllm_config`` on itself; V0 ``AsyncLLMEngine`` keeps them on its ``engine`` (an ``LLMEngine``)."""
    inner = getattr(engine, "engine", None)
    model_config = getattr(engine, "model_config", None) or getattr(inner, "model_config", None)
    vllm_config = getattr(engine, "vllm_config", None)
    cache_config = getattr(vllm_config, "cache_config", None) or getattr(inner, "cache_config", None)
    max_len = getattr(model_config, "max_model_len", None)
    dtype = getattr(model_config, "dtype", None)
    blocks = getattr(cache_config, "num_gpu_blocks", None)
    block_size = getattr(cache_config, "block_size", None)
    return EngineFacts(
        v1=type(engine).__module__.startswith("vllm.v1"),
        max_model_len=int(max_len) if isinstance(max_len, int) and max_len > 0 else None,
        dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
        num_gpu_blocks=int(blocks) if isinstance(blocks, int) and blocks > 0 else None,
        block_size=int(block_size) if isinstance(block_size, int) and block_size > 0 else None,
    )


def shutdown_engine(engine: Any) -> str:
    """Stop a vLLM async engine, best effort across versions; returns the path taken.

    V1 ``AsyncLLM.shutdown()`` stops the engine-core process and the output handler. V0
    ``AsyncLLMEngine`` has ``shutdown_background_loop()``; its executor may have ``shutdown()`` too
    (in-process weights are then freed by garbage collection).
    """
    shutdown = getattr(engine, "shutdown", None)
    if callable(shutdown):
        shutdown()
        return "shutdown"
    stop_loop = getattr(engine, "shutdown_background_loop", None)
    if callable(stop_loop):
        stop_loop()
        executor = getattr(getattr(engine, "engine", None), "model_executor", None)
        if callable(getattr(executor, "shutdown", None)):
            executor.shutdown()
        return "shutdown_background_loop"
    return "none"


def engine_queue_s(metrics: Any) -> float | None:
    """vLLM's own queueing time of a request from ``RequestOutput.metrics``, when the version has it.

    V0 ``RequestMetrics``: ``first_scheduled_time - arrival_time`` (wall clock, difference only);
    V1 ``RequestStateStats``: ``scheduled_ts - queued_ts`` (engine-core monotonic clock). None
    otherwise (the adapter then reports only its own hand-off delay).
    """
    if metrics is None:
        return None
    for start, end in (("arrival_time", "first_scheduled_time"), ("queued_ts", "scheduled_ts")):
        a, b = getattr(metrics, start, None), getattr(metrics, end, None)
        if isinstance(a, int | float) and isinstance(b, int | float) and a > 0 and b > 0:
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
    """Close an async generator; V0's stream raises CancelledError on close, which is not ours."""
    aclose = getattr(generator, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:
        log.debug("closing a vLLM output stream failed", exc_info=True)


def total_gpu_memory_bytes() -> int:
    """Total memory of GPU 0 without creating a CUDA context here if vLLM can tell (NVML)."""
    try:
        from vllm.platforms import current_platform

        return int(current_platform.get_device_total_memory(0))
    except Exception:
        pass
    try:
        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).total_memory)
    except Exception:
        pass
    return 0


def auto_dtype(hf_config: Any) -> str:
    """vLLM's ``dtype="auto"``: the checkpoint dtype, with float32 checkpoints run in float16."""
    # transformers >= 4.56 names it ``dtype`` (reading ``torch_dtype`` there warns); older: torch_dtype
    dtype = hf_config.dtype if hasattr(hf_config, "dtype") else getattr(hf_config, "torch_dtype", None)
    name = str(dtype).removeprefix("torch.") if dtype is not None else "float16"
    return "bfloat16" if name == "bfloat16" else "float16"
