"""Optional vLLM backend: the executor interface of ``executor.Executor`` on top of vLLM async engines.

One vLLM async engine per loaded model, each driven from its own event-loop thread (so a blocking
load or shutdown of one model never stalls another model's streams, and ``load``/``unload`` can block
from any thread). vLLM is imported lazily: this module imports without it, and constructing
``VllmExecutor`` without it raises ``BackendUnavailable``.

What differs from the native executor:

* no unified KV pool and no KV export/import (``supports_kv_transfer = False``): a migrated or resumed
  request is re-prefilled from ``prompt_token_ids + resume_token_ids`` (token transfer);
* ``load_snapshot`` KV numbers are adapter-side estimates (prompt + generated tokens of requests that
  have produced output, times the model's bytes per token), not vLLM's block usage; a request counts
  as *waiting* until its first output arrives and as *running* afterwards;
* ``kv_capacity_bytes`` is ``num_gpu_blocks * block_size * kv_bytes_per_token`` when the installed vLLM
  exposes the block count after start-up, else the estimate ``memory share - weights``.

Completion text is not vLLM's: token ids come from vLLM (cumulative ``RequestOutput``s turned into
deltas), text and stop strings go through the same ``TextStream`` as the native executor, so both
backends produce the same text for the same tokens, including across a resume. Stop strings are also
given to vLLM so it stops in-engine; whichever side sees a stop first ends the stream.

vLLM API differences handled here (each branch names the versions it is for):

* engine class: ``vllm.engine.async_llm_engine.AsyncLLMEngine`` (V0 before 0.8; in 0.8-0.10 its
  ``from_engine_args`` returns the V1 ``AsyncLLM`` when ``VLLM_USE_V1``; an alias of ``AsyncLLM`` once
  V0 was removed), falling back to ``vllm.v1.engine.async_llm.AsyncLLM`` if that module is gone;
* shutdown: V1 ``AsyncLLM.shutdown()``; V0 ``shutdown_background_loop()`` (+ executor shutdown);
* cancellation: V1 ``generate`` aborts on ``CancelledError``/``GeneratorExit`` itself, V0 does not on
  ``CancelledError``, so the adapter always calls ``engine.abort(request_id)`` too (a no-op when done);
* engine/sampling keyword names that changed (``disable_log_requests`` -> ``enable_log_requests``)
  are filtered against the installed classes' fields;
* ``gpu_memory_utilization`` is per engine instance in most versions but counted against all memory
  used by the process (cumulative) for in-process V0 engines from 0.6.4 on: see
  ``uses_cumulative_memory_accounting``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import gc
import inspect
import itertools
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from llmfleet.types import ModelSpec

from llmfleet_engine.executor import (
    Chunk,
    DuplicateRequestError,
    ExecutorClosedError,
    FinishReason,
    LoadResult,
    LoadSnapshot,
    ModelConflictError,
    ModelLoad,
    QueueFullError,
    ReconcileResult,
    RequestStream,
    TextStream,
    Usage,
)
from llmfleet_engine.models import (
    DEFAULT_DTYPE,
    LoadedModel,
    ModelLoadError,
    ModelSourceNotFound,
    kv_bytes_per_token,
    materialize,
)
from llmfleet_engine.reconcile import reconcile as reconcile_models
from llmfleet_engine.sampling import SamplingConfig
from llmfleet_engine.validation import GenerationRequest, UnknownModelError

log = logging.getLogger(__name__)

BACKEND = "vllm"
INSTALL_HINT = "the vLLM backend needs `pip install -e .[vllm]` on a CUDA host"
VLLM_DTYPES = ("auto", "float16", "bfloat16", "float32")
MEMORY_ACCOUNTING = ("auto", "per_instance", "cumulative")
_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


class BackendUnavailable(RuntimeError):
    """The vLLM backend cannot run here (vLLM is not installed or fails to import)."""


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


# --------------------------------------------------------------------------------------------------
# Pure mapping functions (no vLLM needed; unit-tested with plain objects shaped like vLLM's)


def engine_prompt(request: GenerationRequest) -> dict[str, list[int]]:
    """The vLLM prompt (a ``TokensPrompt`` dict): the prompt ids followed by the resumed ids.

    Resuming re-prefills everything the client already has; vLLM then generates only what is left.
    """
    return {"prompt_token_ids": [*request.prompt_token_ids, *request.resume_token_ids]}


def sampling_kwargs(sampling: SamplingConfig, resumed: int = 0) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` of a request that already has ``resumed`` tokens.

    Temperature 0 is greedy (vLLM treats temperature 0 as greedy; top_p is 1 and no seed then);
    ``max_tokens`` counts only the tokens still to generate. vLLM detokenizes only to match stop
    strings (the adapter makes the text itself).
    """
    remaining = sampling.max_tokens - resumed
    if remaining < 1:
        raise ValueError(f"nothing left to generate: max_tokens {sampling.max_tokens}, resumed {resumed}")
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": remaining,
        "stop": list(sampling.stop),
        "detokenize": bool(sampling.stop),
        "skip_special_tokens": True,
    }
    if sampling.greedy:
        kwargs.update(temperature=0.0, top_p=1.0, seed=None)
    else:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, seed=sampling.seed)
    return kwargs


_FINISH_REASONS = {
    "length": FinishReason.LENGTH,
    "abort": FinishReason.CANCELLED,
    "error": FinishReason.ERROR,
    "repetition": FinishReason.STOP,
}


def map_finish_reason(reason: str | None, stop_reason: int | str | None = None) -> FinishReason | None:
    """vLLM's ``CompletionOutput.finish_reason``/``stop_reason`` as a ``FinishReason``.

    ``"stop"`` with no ``stop_reason`` is the EOS token; with an int it is a stop token id (the adapter
    sets none, so these are extra EOS ids from the generation config): EOS too; with a string it is a
    stop string: STOP. An unknown reason from a newer vLLM reads as STOP.
    """
    if reason is None:
        return None
    if reason == "stop":
        return FinishReason.STOP if isinstance(stop_reason, str) else FinishReason.EOS
    return _FINISH_REASONS.get(str(reason), FinishReason.STOP)


@dataclass(frozen=True)
class OutputDelta:
    """What one cumulative ``RequestOutput`` adds: new completion ids (EOS dropped) and the reason."""

    token_ids: tuple[int, ...]
    seen: int  # engine completion tokens consumed so far, a dropped EOS included
    finish_reason: FinishReason | None


def output_delta(output: Any, seen: int, eos_token_ids: Iterable[int] = ()) -> OutputDelta:
    """The new part of a cumulative vLLM ``RequestOutput`` after ``seen`` completion tokens.

    Reads ``output.outputs[0].token_ids/finish_reason/stop_reason`` and ``output.finished``. vLLM
    includes the EOS (or stop token) in ``token_ids``; the native executor never emits it, so it is
    dropped here. A finished output without a reason reads as STOP.
    """
    completion = output.outputs[0] if getattr(output, "outputs", None) else None
    ids = tuple(int(t) for t in completion.token_ids) if completion is not None else ()
    new = ids[seen:] if len(ids) > seen else ()
    stop_reason = getattr(completion, "stop_reason", None)
    reason = map_finish_reason(getattr(completion, "finish_reason", None), stop_reason)
    if reason is None and getattr(output, "finished", False):
        reason = FinishReason.STOP
    if reason is FinishReason.EOS and new:
        eos = set(eos_token_ids)
        if isinstance(stop_reason, int):
            eos.add(stop_reason)
        if new[-1] in eos:
            new = new[:-1]
    return OutputDelta(new, max(seen, len(ids)), reason)


@dataclass(frozen=True)
class Step:
    """One chunk's worth of progress: ``index`` is the completion position of ``token_ids[0]``."""

    index: int
    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None


class CompletionAssembler:
    """Turns a request's cumulative vLLM outputs into chunk steps with the native text semantics.

    Keeps the completion ids (resumed ones first, so indices continue after a resume), runs them
    through ``TextStream`` (stop strings, held-back partial characters), caps at ``max_tokens``.
    ``feed`` computes the next step; ``commit`` records it once it is emitted.
    """

    def __init__(self, request: GenerationRequest, tokenizer: Any, eos_token_ids: Iterable[int] = ()) -> None:
        self.request = request
        self.eos_token_ids = frozenset(eos_token_ids)
        self.tokens: list[int] = list(request.resume_token_ids)
        self._pending = len(self.tokens)  # completion length including fed, uncommitted steps
        self._seen = 0
        self._text = TextStream(tokenizer, request.sampling.stop, context_ids=request.prompt_token_ids)
        stopped = False
        for token in request.resume_token_ids:  # replay what the client already has
            stopped = self._text.push(token)[1] or stopped
        self.initial_finish: FinishReason | None = None
        if stopped:
            self.initial_finish = FinishReason.STOP
        elif len(self.tokens) >= request.sampling.max_tokens:
            self.initial_finish = FinishReason.LENGTH

    def feed(self, output: Any) -> Step | None:
        """The step for one cumulative output; None when it adds nothing (no tokens, not final)."""
        delta = output_delta(output, self._seen, self.eos_token_ids)
        self._seen = delta.seen
        max_tokens = self.request.sampling.max_tokens
        index = self._pending
        taken: list[int] = []
        text = ""
        reason: FinishReason | None = None
        for token in delta.token_ids:
            taken.append(token)
            piece, stopped = self._text.push(token)
            text += piece
            if stopped:  # TextStream cut the text at the stop and dropped what followed
                reason = FinishReason.STOP
                break
            if index + len(taken) >= max_tokens:  # never more than asked, whatever the engine does
                reason = FinishReason.LENGTH
                text += self._text.finish()
                break
        if reason is None and delta.finish_reason is not None:
            reason = delta.finish_reason
            if reason in (FinishReason.LENGTH, FinishReason.EOS, FinishReason.STOP):
                text += self._text.finish()  # held-back text (cut at a stop string if one matches)
        self._pending += len(taken)
        if not taken and not text and reason is None:
            return None
        return Step(index, tuple(taken), text, reason)

    def commit(self, step: Step) -> None:
        """Record an emitted step's tokens."""
        self.tokens.extend(step.token_ids)


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


def engine_dtype(spec_dtype: str | None, configured: str = "auto") -> str:
    """The vLLM ``dtype`` for a model spec: a configured dtype wins; float32 (unspecified) -> auto."""
    if configured != "auto":
        return configured
    if spec_dtype in ("float16", "bfloat16"):
        return spec_dtype
    return "auto"


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


# --------------------------------------------------------------------------------------------------
# vLLM import and per-model engine hosts


@dataclass(frozen=True)
class _VllmApi:
    version: str
    engine_cls: Any
    engine_args_cls: Any
    sampling_params_cls: Any
    v1_default: bool


def _import_vllm() -> _VllmApi:
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
    return _VllmApi(
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


class _EngineHost:
    """A thread running one event loop for one model's vLLM engine."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"vllm-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def submit(self, coro: Any) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Any, timeout: float | None = None) -> Any:
        """Run ``coro`` on the host loop and wait for it (never from the host thread itself)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("_EngineHost.call from its own loop would deadlock")
        return self.submit(coro).result(timeout)

    def stop(self, timeout: float | None = None) -> None:
        if self.loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)


@dataclass(kw_only=True)
class VllmLoadedModel(LoadedModel):
    """A ``LoadedModel`` whose ``model`` is a vLLM async engine; ``dtype`` is the requested label."""

    engine_dtype: str = "auto"
    memory_fraction: float = 0.0
    engine_api: str = "v1"


@dataclass(eq=False)
class _Runtime:
    model: VllmLoadedModel
    host: _EngineHost
    facts: EngineFacts
    kv_capacity_bytes: int = 0
    drivers: set[asyncio.Task] = field(default_factory=set)  # touched only in the host loop

    @property
    def engine(self) -> Any:
        return self.model.model


@dataclass(eq=False)
class _Request:
    req: GenerationRequest
    runtime: _Runtime
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Chunk]
    assembler: CompletionAssembler
    engine_request_id: str = ""
    future: concurrent.futures.Future | None = None
    handed_s: float | None = None
    engine_queue_s: float | None = None
    first_token_s: float | None = None
    finished: bool = False

    @property
    def request_id(self) -> str:
        return self.req.request_id


# --------------------------------------------------------------------------------------------------
# The executor


class VllmExecutor:
    """The engine executor interface on vLLM: one async engine per model, requests streamed as chunks.

    Thread-safe like ``executor.Executor``: ``load``/``unload``/``reconcile``/``close`` block (call them
    via ``asyncio.to_thread``); ``submit`` must be called from a running event loop, whose thread then
    receives the chunks.
    """

    supports_kv_transfer = False

    def __init__(self, config: VllmConfig | None = None) -> None:
        self._api = _import_vllm()
        self.config = config or VllmConfig()
        self.device = self.config.device
        self.backend = BACKEND
        self.memory_bytes = _device_memory_bytes() * self.config.tensor_parallel_size
        self.on_models_changed: list[Callable[[tuple[str, ...]], None]] = []
        self._runtimes: dict[str, _Runtime] = {}
        self._requests: dict[str, _Request] = {}
        self._generated: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._closed = False
        self._sequence = itertools.count(1)
        log.info("vLLM backend: vllm %s (V1 engine by default: %s)", self._api.version, self._api.v1_default)

    # ------------------------------------------------------------------ models

    @property
    def models(self) -> dict[str, LoadedModel]:
        """A copy of the loaded models by name."""
        with self._lock:
            return {name: rt.model for name, rt in self._runtimes.items()}

    def model_names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._runtimes))

    @property
    def kv_capacity_bytes(self) -> int:
        with self._lock:
            return sum(rt.kv_capacity_bytes for rt in self._runtimes.values())

    def load(self, spec: ModelSpec) -> LoadResult:
        """Start a vLLM engine for ``spec`` (blocking). Idempotent for the same source and dtype.

        Raises ``ModelSourceNotFound``/``ModelLoadError`` for bad sources, a full engine
        (``max_models``) or a failed engine start, and ``ModelConflictError`` when the name is taken.
        """
        if not spec.name.strip():
            raise ModelLoadError("model name is empty")
        label = spec.dtype or DEFAULT_DTYPE
        with self._load_lock:
            with self._lock:
                self._check_open()
                existing = self._runtimes.get(spec.name)
                loaded = len(self._runtimes)
            if existing is not None:
                if (existing.model.source, existing.model.dtype) == (spec.source, label):
                    return LoadResult(existing.model, already_loaded=True)
                raise ModelConflictError(
                    f"model {spec.name!r} is already loaded from {existing.model.source!r} "
                    f"({existing.model.dtype}); unload it first"
                )
            if loaded >= self.config.max_models:
                raise ModelLoadError(
                    f"cannot load {spec.name!r}: this vLLM engine node holds at most max_models="
                    f"{self.config.max_models} models (each gets an equal share of GPU memory)"
                )
            runtime = self._start(spec, label, loaded)
            with self._lock:
                if self._closed:
                    closed = True
                else:
                    closed = False
                    self._runtimes[spec.name] = runtime
            if closed:
                self._stop_runtime(runtime)
                raise ExecutorClosedError("executor is closed")
        m = runtime.model
        details = f"{m.engine_api}, {m.engine_dtype}, {m.memory_fraction:.0%} of GPU memory, context {m.max_context}"
        log.info("loaded model %s from %s with vLLM (%s) in %.1fs", m.name, m.source, details, m.load_s)
        self._models_changed()
        return LoadResult(m, already_loaded=False)

    async def load_async(self, spec: ModelSpec) -> LoadResult:
        return await asyncio.to_thread(self.load, spec)

    def _start(self, spec: ModelSpec, label: str, loaded: int) -> _Runtime:
        from transformers import AutoConfig, AutoTokenizer

        started = time.perf_counter()
        path, local_only = self._resolve_source(spec.source)
        try:
            hf_config = AutoConfig.from_pretrained(path, local_files_only=local_only)
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
        except OSError as e:
            raise ModelSourceNotFound(f"cannot load {spec.source!r}: {e}") from e
        except (ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f"cannot load model {spec.source!r}: {e}") from e
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
            tokenizer.pad_token = tokenizer.eos_token
        cumulative = {"per_instance": False, "cumulative": True}.get(
            self.config.memory_accounting,
            uses_cumulative_memory_accounting(self._api.version, self._api.v1_default),
        )
        fraction = engine_memory_fraction(
            self.config.gpu_memory_utilization, self.config.max_models, loaded, cumulative
        )
        dtype = engine_dtype(label, self.config.dtype)
        args_cls = self._api.engine_args_cls
        args = args_cls(**supported_kwargs(args_cls, engine_kwargs(self.config, path, dtype, fraction)))
        host = _EngineHost(spec.name)
        engine_cls = self._api.engine_cls

        async def build() -> Any:  # in the host loop, so V1 starts its output handler there
            return engine_cls.from_engine_args(args)

        try:
            engine = host.call(build())
        except Exception as e:
            host.stop(self.config.shutdown_timeout_s)
            raise ModelLoadError(f"vLLM could not start {spec.source!r}: {type(e).__name__}: {e}") from e
        try:
            runtime = self._describe(
                spec, label, path, local_only, hf_config, tokenizer, engine, host, fraction
            )
        except Exception as e:  # never leak a started engine
            self._stop_runtime(
                _Runtime(model=_bare_model(spec, engine), host=host, facts=engine_facts(engine))
            )
            raise ModelLoadError(f"cannot describe model {spec.source!r}: {type(e).__name__}: {e}") from e
        runtime.model.load_s = time.perf_counter() - started
        return runtime

    def _describe(
        self,
        spec: ModelSpec,
        label: str,
        path: str,
        local_only: bool,
        hf_config: Any,
        tokenizer: Any,
        engine: Any,
        host: _EngineHost,
        fraction: float,
    ) -> _Runtime:
        """The ``_Runtime`` of a started engine: facts from the engine, else from the HF config."""
        facts = engine_facts(engine)
        dtype = engine_dtype(label, self.config.dtype)
        actual_dtype = facts.dtype or (dtype if dtype != "auto" else _auto_dtype(hf_config))
        torch_dtype = _TORCH_DTYPES.get(actual_dtype, torch.float16)
        config_len = int(getattr(hf_config, "max_position_embeddings", 0) or tokenizer.model_max_length)
        max_context = facts.max_model_len or min(config_len, self.config.max_model_len or config_len)
        weight_bytes = _weight_bytes(hf_config, torch_dtype)
        bpt = _kv_bytes_per_token(hf_config, torch_dtype)
        if facts.num_gpu_blocks and facts.block_size:
            kv_capacity = facts.num_gpu_blocks * facts.block_size * bpt
        else:  # estimate: this engine's memory share minus its weights
            kv_capacity = max(0, int(fraction * self.memory_bytes) - weight_bytes)
        model = VllmLoadedModel(
            name=spec.name,
            source=spec.source,
            model=engine,
            tokenizer=tokenizer,
            architecture=(getattr(hf_config, "architectures", None) or [hf_config.model_type])[0],
            dtype=label,
            device=self.device,
            weight_bytes=weight_bytes,
            max_context=max_context,
            kv_bytes_per_token=bpt,
            eos_token_ids=_eos_token_ids(path, hf_config, tokenizer, local_only),
            vocab_size=int(hf_config.vocab_size),
            path=path,
            engine_dtype=actual_dtype,
            memory_fraction=fraction,
            engine_api="v1" if facts.v1 else "v0",
        )
        return _Runtime(model=model, host=host, facts=facts, kv_capacity_bytes=kv_capacity)

    def _resolve_source(self, source: str) -> tuple[str, bool]:
        """A checkpoint dir or hub id for vLLM (``tiny://`` built first) and whether it is local-only."""
        path = materialize(source, self.config.cache_dir)
        if Path(path).is_dir():
            return path, True
        if self.config.allow_download:
            return path, False
        try:  # offline: only the local Hugging Face cache
            from huggingface_hub import snapshot_download

            return snapshot_download(repo_id=path, local_files_only=True), True
        except Exception as e:
            raise ModelSourceNotFound(f"hub model {source!r} is not in the local cache (offline): {e}") from e

    def unload(self, name: str) -> bool:
        """Unload ``name``: cancel its requests and shut its engine down; False when not loaded."""
        if not self._unload(name):
            return False
        log.info("unloaded model %s", name)
        self._models_changed()
        return True

    def _unload(self, name: str, timeout_s: float | None = None) -> bool:
        with self._lock:
            runtime = self._runtimes.pop(name, None)
            if runtime is None:
                return False
            states = [s for s in self._requests.values() if s.runtime is runtime]
            for state in states:
                self._finish_locked(state, FinishReason.CANCELLED)
        for state in states:
            if state.future is not None:
                state.future.cancel()
        self._stop_runtime(runtime, timeout_s)
        return True

    def _stop_runtime(self, runtime: _Runtime, timeout_s: float | None = None) -> None:
        timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s

        async def stop() -> str:
            tasks = [t for t in runtime.drivers if not t.done()]
            for task in tasks:  # request drivers: run their abort handlers before the engine goes
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=min(5.0, timeout))
            return shutdown_engine(runtime.engine)

        try:
            path = runtime.host.call(stop(), timeout)
            log.debug("vLLM engine of %s stopped via %s", runtime.model.name, path)
        except Exception:
            log.warning("shutting down the vLLM engine of %s failed", runtime.model.name, exc_info=True)
        runtime.host.stop(timeout)
        runtime.model.model = None  # drop the engine reference so its memory can be freed
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # in-process (V0) engines

    def reconcile(self, desired: Iterable[ModelSpec]) -> ReconcileResult:
        """Load and unload so that exactly ``desired`` is loaded; failures are reported, not raised."""
        return reconcile_models(self, desired, (ModelLoadError, ModelConflictError, ExecutorClosedError))

    def _models_changed(self) -> None:
        names = self.model_names()
        for callback in list(self.on_models_changed):
            try:
                callback(names)
            except Exception:
                log.exception("on_models_changed callback failed")

    # ---------------------------------------------------------------- requests

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Start a validated request on its model's engine; returns its chunk stream.

        Call from a running event loop. Raises ``UnknownModelError``, ``DuplicateRequestError``,
        ``QueueFullError`` or ``ExecutorClosedError``.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            self._check_open()
            runtime = self._runtimes.get(request.model)
        if runtime is None:
            raise UnknownModelError(request.model, self.model_names())
        model = runtime.model
        assembler = CompletionAssembler(request, model.tokenizer, model.eos_token_ids)
        state = _Request(
            req=request,
            runtime=runtime,
            loop=loop,
            queue=asyncio.Queue(),
            assembler=assembler,
            # unique inside vLLM, so a resubmitted id never meets its predecessor's abort in flight
            engine_request_id=f"{request.request_id}.{next(self._sequence)}",
        )
        with self._lock:
            self._check_open()
            if self._runtimes.get(request.model) is not runtime:
                raise UnknownModelError(request.model, list(self._runtimes))
            if request.request_id in self._requests:
                raise DuplicateRequestError(f"request {request.request_id!r} is already active")
            if len(self._requests) >= self.config.max_requests:
                raise QueueFullError(f"too many active requests ({self.config.max_requests})")
            self._requests[request.request_id] = state
            if assembler.initial_finish is not None:  # the resumed tokens already end it
                self._finish_locked(state, assembler.initial_finish)
            else:
                state.future = runtime.host.submit(self._drive(state))
        return RequestStream(self, request.request_id, state.queue)

    def cancel(self, request_id: str) -> bool:
        """Cancel an active request (final chunk CANCELLED, engine abort); False if unknown/finished."""
        with self._lock:
            state = self._requests.get(request_id)
            if state is None or state.finished:
                return False
            self._finish_locked(state, FinishReason.CANCELLED)
        if state.future is not None:
            state.future.cancel()  # cancels the driver task; its handler aborts the vLLM request
        return True

    def attach(self, request_id: str) -> RequestStream | None:
        """Stream of a migrated-in request not yet consumed: never any here (no KV import); None."""
        return None

    def cancel_if_unattached(self, request_id: str) -> bool:
        """Counterpart of ``attach`` for imported requests, which this backend never has: False."""
        return False

    async def _drive(self, state: _Request) -> None:
        """Runs in the model's host loop: stream the vLLM request into chunks."""
        engine = state.runtime.engine
        rid = state.engine_request_id
        engine_done = False
        task = asyncio.current_task()
        if task is not None:
            state.runtime.drivers.add(task)
            task.add_done_callback(state.runtime.drivers.discard)
        try:
            params_cls = self._api.sampling_params_cls
            kwargs = sampling_kwargs(state.req.sampling, len(state.req.resume_token_ids))
            params = params_cls(**supported_kwargs(params_cls, kwargs))
            with self._lock:
                if state.finished:
                    return
                state.handed_s = time.monotonic()
            outputs = engine.generate(engine_prompt(state.req), params, rid)
            try:
                async for output in outputs:
                    engine_done = bool(getattr(output, "finished", False))
                    if self._on_output(state, output):
                        break
            finally:
                await _aclose(outputs)
            if not engine_done:
                await _abort(engine, rid)  # we stopped first (stop string, max_tokens)
            with self._lock:
                if not state.finished:  # the engine stream ended without a final output
                    log.error("vLLM ended request %s without a final output", rid)
                    self._finish_locked(state, FinishReason.ERROR)
        except asyncio.CancelledError:
            await _abort(engine, rid)
            raise
        except Exception:
            log.exception("vLLM request %s failed", rid)
            with self._lock:
                if not state.finished:
                    self._finish_locked(state, FinishReason.ERROR)
            await _abort(engine, rid)

    def _on_output(self, state: _Request, output: Any) -> bool:
        """Handle one ``RequestOutput``; True when the request is over for the adapter."""
        step = state.assembler.feed(output)
        queued = engine_queue_s(getattr(output, "metrics", None))
        now = time.monotonic()
        with self._lock:
            if state.finished:
                return True
            if queued is not None:
                state.engine_queue_s = queued
            if step is None:
                return False
            if state.first_token_s is None:
                state.first_token_s = now
            state.assembler.commit(step)
            if step.token_ids:
                self._generated.append((now, len(step.token_ids)))
                self._trim_window(now)
            if step.finish_reason is None:
                self._emit(state, Chunk(state.request_id, step.index, step.token_ids, step.text))
                return False
            self._finish_locked(state, step.finish_reason, step=step, now=now)
            return True

    def _finish_locked(
        self, state: _Request, reason: FinishReason, *, step: Step | None = None, now: float | None = None
    ) -> None:
        """Retire ``state`` and emit its final chunk (holding ``self._lock``)."""
        now = time.monotonic() if now is None else now
        state.finished = True
        self._requests.pop(state.request_id, None)
        arrival = state.req.arrival_s
        first = state.first_token_s
        if state.handed_s is None:
            scheduled = now if first is None else first
        else:
            scheduled = state.handed_s + (state.engine_queue_s or 0.0)
            if first is not None:
                scheduled = min(scheduled, first)
        usage = Usage(
            prompt_tokens=state.req.prompt_tokens,
            completion_tokens=len(state.assembler.tokens),
            queue_s=max(0.0, min(scheduled, now) - arrival),
            ttft_s=max(0.0, first - arrival) if first is not None else 0.0,
            latency_s=max(0.0, now - arrival),
        )
        if step is None:
            step = Step(len(state.assembler.tokens), (), "")
        self._emit(state, Chunk(state.request_id, step.index, step.token_ids, step.text, reason, usage))

    def _emit(self, state: _Request, chunk: Chunk) -> None:
        try:
            state.loop.call_soon_threadsafe(state.queue.put_nowait, chunk)
        except RuntimeError:  # the consumer's loop is gone: nobody reads this request
            if not state.finished:
                self._finish_locked(state, FinishReason.CANCELLED)
            if state.future is not None:
                state.future.cancel()

    def _trim_window(self, now: float) -> None:
        horizon = now - self.config.throughput_window_s
        while self._generated and self._generated[0][0] < horizon:
            self._generated.popleft()

    def load_snapshot(self) -> LoadSnapshot:
        """Requests per model; KV numbers are adapter estimates (see the module docstring)."""
        now = time.monotonic()
        with self._lock:
            per_model = {name: [0, 0, 0] for name in self._runtimes}  # running, waiting, kv tokens
            bpt = {name: rt.model.kv_bytes_per_token for name, rt in self._runtimes.items()}
            for state in self._requests.values():
                counts = per_model.get(state.req.model)
                if counts is None:
                    continue
                if state.first_token_s is None:
                    counts[1] += 1
                else:
                    counts[0] += 1
                    counts[2] += state.req.prompt_tokens + len(state.assembler.tokens)
            self._trim_window(now)
            generated = sum(n for _, n in self._generated)
            capacity = sum(rt.kv_capacity_bytes for rt in self._runtimes.values())
        models = tuple(
            ModelLoad(model=name, running=r, waiting=w, kv_tokens=kv, kv_used_bytes=kv * bpt[name])
            for name, (r, w, kv) in sorted(per_model.items())
        )
        return LoadSnapshot(
            timestamp=time.time(),
            running=sum(m.running for m in models),
            waiting=sum(m.waiting for m in models),
            kv_used_bytes=sum(m.kv_used_bytes for m in models),
            kv_capacity_bytes=capacity,
            tokens_per_s=generated / self.config.throughput_window_s,
            models=models,
        )

    def close(self, timeout_s: float | None = None) -> None:
        """Cancel every request and shut every engine down (each within ``timeout_s``)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            names = list(self._runtimes)
        for name in names:
            self._unload(name, timeout_s)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def _check_open(self) -> None:
        if self._closed:
            raise ExecutorClosedError("executor is closed")


# --------------------------------------------------------------------------------------------------
# helpers


async def _abort(engine: Any, request_id: str) -> None:
    """``engine.abort(request_id)``, best effort (a no-op in vLLM for finished/unknown requests)."""
    try:
        await engine.abort(request_id)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:
        log.debug("aborting vLLM request %s failed", request_id, exc_info=True)


async def _aclose(generator: Any) -> None:
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


def _bare_model(spec: ModelSpec, engine: Any) -> VllmLoadedModel:
    """A placeholder record holding ``engine`` (to shut down an engine that failed to describe)."""
    return VllmLoadedModel(
        name=spec.name,
        source=spec.source,
        model=engine,
        tokenizer=None,
        architecture="",
        dtype=spec.dtype or DEFAULT_DTYPE,
        device="cuda",
        weight_bytes=0,
        max_context=0,
        kv_bytes_per_token=0,
        eos_token_ids=frozenset(),
        vocab_size=0,
    )


def _device_memory_bytes() -> int:
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


def _auto_dtype(hf_config: Any) -> str:
    """vLLM's ``dtype="auto"``: the checkpoint dtype, with float32 checkpoints run in float16."""
    # transformers >= 4.56 names it ``dtype`` (reading ``torch_dtype`` there warns); older: torch_dtype
    dtype = hf_config.dtype if hasattr(hf_config, "dtype") else getattr(hf_config, "torch_dtype", None)
    name = str(dtype).removeprefix("torch.") if dtype is not None else "float16"
    return "bfloat16" if name == "bfloat16" else "float16"


def _weight_bytes(hf_config: Any, dtype: torch.dtype) -> int:
    """Parameter bytes of the architecture in ``dtype``, counted on the meta device (0 if unknown)."""
    try:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
        itemsize = torch.empty((), dtype=dtype).element_size()
        return sum(p.numel() for p in model.parameters()) * itemsize
    except Exception:
        log.debug("cannot count the weights of %s", getattr(hf_config, "model_type", "?"), exc_info=True)
        return 0


def _kv_bytes_per_token(hf_config: Any, dtype: torch.dtype) -> int:
    try:
        return kv_bytes_per_token(hf_config, dtype)
    except (AttributeError, TypeError, ZeroDivisionError):
        return 0


def _eos_token_ids(path: str, hf_config: Any, tokenizer: Any, local_only: bool) -> frozenset[int]:
    values: list[Any] = [getattr(hf_config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)]
    try:
        from transformers import GenerationConfig

        values.append(GenerationConfig.from_pretrained(path, local_files_only=local_only).eos_token_id)
    except Exception:
        pass  # no generation_config.json
    ids: set[int] = set()
    for value in values:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, Sequence) and not isinstance(value, str):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)
