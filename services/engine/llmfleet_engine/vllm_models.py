"""Model lifecycle of the vLLM backend: one vLLM async engine per model, each on its own event-loop
thread (``EngineHost``), started and described on load and shut down on unload (``VllmModels``,
mixed into ``vllm_backend.VllmExecutor``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from llmfleet.types import ModelSpec

from llmfleet_engine.model_host import DrainBook
from llmfleet_engine.models import (
    DEFAULT_DTYPE,
    LoadedModel,
    ModelLoadError,
    ModelSourceNotFound,
    eos_ids,
    kv_bytes_per_token,
    materialize,
)
from llmfleet_engine.outputs import (
    ExecutorClosedError,
    FinishReason,
    LoadResult,
    ModelConflictError,
    ReconcileResult,
)
from llmfleet_engine.reconcile import reconcile as reconcile_models
from llmfleet_engine.vllm_compat import EngineFacts, VllmApi, engine_facts, kv_event_decoder
from llmfleet_engine.vllm_config import VllmConfig, engine_dtype, engine_kwargs
from llmfleet_engine.vllm_kv_events import (
    CachedBlocks,
    EventEndpoints,
    endpoints,
    private_directory,
    user_endpoints,
)
from llmfleet_engine.vllm_lora_residency import LoraResidency
from llmfleet_engine.vllm_stats import ModelStats, stat_logger_factory
from llmfleet_engine.vllm_zero_adapter import ZERO_LORA_ID

if TYPE_CHECKING:
    from llmfleet.metrics.engine import EngineMetrics

log = logging.getLogger(__name__)

_ENGINE_NUMBERS = itertools.count(1)  # each engine's event sockets are its own, also when a model reloads
_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


class EngineHost:
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
            raise RuntimeError("EngineHost.call from its own loop would deadlock")
        return self.submit(coro).result(timeout)

    def stop(self, timeout: float | None = None) -> None:
        if self.loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)


@dataclass(kw_only=True)
class VllmLoadedModel(LoadedModel):
    """A ``LoadedModel`` whose ``model`` is a vLLM async engine; ``dtype`` is the requested label,
    ``engine_dtype`` the one vLLM runs."""

    engine_dtype: str = "auto"
    hf_config: Any = None  # the checkpoint's transformers config (the adapters' shapes are checked on it)


@dataclass(eq=False)
class ModelRuntime:
    """A loaded model: its record (holding the engine), the engine's host thread, what the engine says
    about itself, vLLM's scheduler numbers and the request drivers running on the host."""

    model: VllmLoadedModel
    host: EngineHost
    facts: EngineFacts
    stats: ModelStats
    dead: bool = False  # its engine core died; it is being unloaded
    loras: LoraResidency | None = None  # the LoRA adapters its engine holds (None: LoRA off)
    cached: CachedBlocks | None = None  # its prefix cache's blocks, from vLLM's KV events (None: off)
    drivers: set[asyncio.Task] = field(default_factory=set)  # touched only in the host loop

    @property
    def engine(self) -> Any:
        return self.model.model

    @property
    def kv_blocks(self) -> int:
        """vLLM's KV blocks but the one it keeps as a null block."""
        return max(0, self.facts.num_blocks - 1)

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens vLLM's KV cache holds: ``kv_blocks`` x block size (what its ``kv_cache_usage`` is a
        fraction of)."""
        return self.kv_blocks * self.facts.block_size

    @property
    def kv_capacity_bytes(self) -> int:
        return self.kv_capacity_tokens * self.model.kv_bytes_per_token


class VllmModels:
    """Models of ``VllmExecutor`` (a mixin; the state is made in ``VllmExecutor.__init__``; unloading
    finishes the model's requests with ``VllmRequests._finish_locked``)."""

    config: VllmConfig
    device: str
    memory_bytes: int
    on_models_changed: list[Callable[[tuple[str, ...]], None]]
    _api: VllmApi
    metrics: EngineMetrics | None
    _lock: threading.Lock
    _load_lock: threading.Lock
    _closed: bool
    _runtimes: dict[str, ModelRuntime]
    _events_dir: str | None  # where the engines publish their KV events (made at the first load)
    _requests: dict[str, Any]  # request id -> vllm_requests.ActiveRequest (owned by VllmRequests)
    _drains: DrainBook  # owned by vllm_drains.VllmDrains
    evict: Callable[[str, str], bool]  # vllm_drains.VllmDrains

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
            if loaded >= self.config.settings.max_models:
                raise ModelLoadError(
                    f"cannot load {spec.name!r}: this vLLM engine node holds at most max_models="
                    f"{self.config.settings.max_models} models (each gets an equal share of GPU memory)"
                )
            runtime = self._start(spec, label)
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
        details = f"{m.engine_dtype}, {runtime.kv_capacity_tokens} KV tokens, context {m.max_context}"
        log.info("loaded model %s from %s with vLLM (%s) in %.1fs", m.name, m.source, details, m.load_s)
        self._models_changed()
        return LoadResult(m, already_loaded=False)

    async def load_async(self, spec: ModelSpec) -> LoadResult:
        return await asyncio.to_thread(self.load, spec)

    def _start(self, spec: ModelSpec, label: str) -> ModelRuntime:
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
        dtype = engine_dtype(label, self.config.settings.dtype)
        args = self._api.engine_args_cls(**engine_kwargs(self.config, path, dtype))
        events = self._event_endpoints(spec.name)
        if events is not None and "kv_events_config" not in self.config.settings.engine_args:
            args.kv_events_config = self._api.kv_events_config_cls(
                enable_kv_cache_events=True,
                publisher="zmq",
                endpoint=events.publish,
                replay_endpoint=events.replay,
            )
        stats = ModelStats(spec.name, self.metrics)
        logger = stat_logger_factory(self._api.stat_logger_cls, stats)
        host = EngineHost(spec.name)
        engine_cls = self._api.engine_cls

        async def build() -> Any:  # in the host loop, so the engine's output handler runs there
            return engine_cls.from_engine_args(args, stat_loggers=[logger])

        try:
            engine = host.call(build())
        except Exception as e:
            host.stop(self.config.shutdown_timeout_s)
            raise ModelLoadError(f"vLLM could not start {spec.source!r}: {type(e).__name__}: {e}") from e
        cached = None
        try:
            if events is not None:
                cached = CachedBlocks(events, kv_event_decoder(self._api), spec.name)
            runtime = self._describe(
                spec, label, path, local_only, hf_config, tokenizer, engine, host, stats, cached
            )
        except Exception as e:  # never leak a started engine
            facts = EngineFacts(max_model_len=0, dtype="", num_blocks=0, block_size=0)
            self._stop_runtime(
                ModelRuntime(
                    model=_bare_model(spec, engine), host=host, facts=facts, stats=stats, cached=cached
                )
            )
            raise ModelLoadError(f"cannot describe model {spec.source!r}: {type(e).__name__}: {e}") from e
        runtime.model.load_s = time.perf_counter() - started
        return runtime

    def _event_endpoints(self, name: str) -> EventEndpoints | None:
        """Where the engine of model ``name`` publishes its KV events, with prefix caching on: private
        sockets of the node, or those of the ``kv_events_config`` the settings' ``engine_args`` give
        (None where that one cannot be counted from)."""
        s = self.config.settings
        if not s.enable_prefix_caching:
            return None
        if "kv_events_config" in s.engine_args:  # the user's, as vLLM takes it
            return user_endpoints(s.engine_args["kv_events_config"])
        if self._events_dir is None:
            self._events_dir = private_directory()
        return endpoints(self._events_dir, f"{name}-{next(_ENGINE_NUMBERS)}")

    def _describe(
        self,
        spec: ModelSpec,
        label: str,
        path: str,
        local_only: bool,
        hf_config: Any,
        tokenizer: Any,
        engine: Any,
        host: EngineHost,
        stats: ModelStats,
        cached: CachedBlocks | None,
    ) -> ModelRuntime:
        """The ``ModelRuntime`` of a started engine: context, dtype and KV blocks as vLLM reports them,
        and its prefix cache's counter."""
        facts = engine_facts(engine)
        torch_dtype = _TORCH_DTYPES.get(facts.dtype, torch.float16)
        model = VllmLoadedModel(
            name=spec.name,
            source=spec.source,
            model=engine,
            tokenizer=tokenizer,
            architecture=(getattr(hf_config, "architectures", None) or [hf_config.model_type])[0],
            dtype=label,
            device=self.device,
            weight_bytes=_weight_bytes(hf_config, torch_dtype),
            max_context=facts.max_model_len,
            kv_bytes_per_token=_kv_bytes_per_token(hf_config, torch_dtype),
            eos_token_ids=_eos_token_ids(path, hf_config, tokenizer, local_only),
            vocab_size=int(hf_config.vocab_size),
            path=path,
            engine_dtype=facts.dtype,
            hf_config=hf_config,
        )
        loras = (
            LoraResidency(engine.list_loras, hidden=frozenset({ZERO_LORA_ID}))
            if self.config.max_loras
            else None
        )
        return ModelRuntime(model=model, host=host, facts=facts, stats=stats, loras=loras, cached=cached)

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
            self._drains.models.pop(name, None)
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

    def _engine_died(self, runtime: ModelRuntime, error: BaseException) -> None:
        """A model's engine core died (vLLM answers ``EngineDeadError``): evict its requests, so that
        the scheduler resumes each on another engine from its delivered tokens, and unload the model,
        so that the placement follower loads it again. Once per engine; returns at once."""
        with self._lock:
            if runtime.dead or self._runtimes.get(runtime.model.name) is not runtime:
                return
            runtime.dead = True
            ids = [rid for rid, s in self._requests.items() if s.runtime is runtime and not s.finished]
        name = runtime.model.name
        log.error("the vLLM engine core of %s died (%s); unloading it to load it again", name, error)
        reason = f"the vLLM engine of model {name!r} failed and restarts"
        for rid in ids:
            self.evict(rid, reason)
        threading.Thread(target=self.unload, args=(name,), name=f"vllm-dead-{name}", daemon=True).start()

    def _stop_runtime(self, runtime: ModelRuntime, timeout_s: float | None = None) -> None:
        timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s

        async def stop() -> None:
            tasks = [t for t in runtime.drivers if not t.done()]
            for task in tasks:  # request drivers: run their abort handlers before the engine goes
                task.cancel()
            if runtime.loras is not None:
                runtime.loras.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=min(5.0, timeout))
            runtime.engine.shutdown()  # stops the engine core's process and the output handler

        try:
            runtime.host.call(stop(), timeout)
        except Exception:
            log.warning("shutting down the vLLM engine of %s failed", runtime.model.name, exc_info=True)
        runtime.host.stop(timeout)
        if runtime.cached is not None:
            runtime.cached.close()
        runtime.model.model = None  # drop the engine reference so its memory can be freed
        gc.collect()

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


def _bare_model(spec: ModelSpec, engine: Any) -> VllmLoadedModel:
    """A placeholder record holding ``engine`` (to shut down an engine that failed to describe)."""
    return VllmLoadedModel(
        name=spec.name,
        source=spec.source,
        model=engine,
        tokenizer=None,
        architecture="",
        dtype=spec.dtype or DEFAULT_DTYPE,
        device="",
        weight_bytes=0,
        max_context=0,
        kv_bytes_per_token=0,
        eos_token_ids=frozenset(),
        vocab_size=0,
    )


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
    """``generate``'s EOS ids, as the native backend takes them: the checkpoint's generation config
    (transformers makes one from the model config when the file is missing)."""
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(path, local_files_only=local_only)
    except OSError:  # no generation_config.json
        gen = GenerationConfig.from_model_config(hf_config)
    return eos_ids(gen, tokenizer)
