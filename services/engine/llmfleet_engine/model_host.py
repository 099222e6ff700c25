r"""The executor's model hosting: load/unload models into the unified pool (weights + peak activation
reserved as pool blocks, a KV view registered per model), reconcile to a desired set, and drain a
model before its unload.

Draining (placement replacement, see ``placement_follower``): a draining model stays loaded and its
requests keep running, but it is left out of :meth:`ModelHost.serving_model_names` (the node record,
so schedulers stop routing to it) and the servicer refuses new requests for it with UNAVAILABLE. A
request :meth:`ModelHost.evict`\ ed, or still running when its draining model is unloaded, ends
CANCELLED here and is remembered: the servicer ends its stream with UNAVAILABLE instead, and the
scheduler resumes it on another engine from the delivered tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from llmfleet.engine_core import EngineCore
from llmfleet.kvblocks import BlockAllocator, KvShape, OutOfBlocks
from llmfleet.kvblocks.storage import KvStorage
from llmfleet.types import ModelSpec

from llmfleet_engine.memory import RESERVED_MODEL, MemoryPlan, peak_activation_bytes
from llmfleet_engine.models import LoadedModel, ModelLoadError, load_model
from llmfleet_engine.native.runner import PagedRunner, kv_shape_of
from llmfleet_engine.outputs import (
    ExecutorClosedError,
    FinishReason,
    LoadResult,
    ModelConflictError,
    ReconcileResult,
    ResourceExhaustedError,
)
from llmfleet_engine.reconcile import reconcile as reconcile_models


class _HostRequest(Protocol):
    """What the host reads of a live request (``LiveRequest``, which imports this module)."""

    @property
    def req(self) -> _Model: ...

    @property
    def finished(self) -> bool: ...


class _Model(Protocol):
    @property
    def model(self) -> str: ...


log = logging.getLogger(__name__)

MAX_EVICTIONS = 4096  # evicted request ids remembered for their consumers (oldest forgotten first)


@dataclass
class DrainBook:
    """Draining models (name -> why) and evicted requests not yet reported (request id -> why)."""

    models: dict[str, str] = field(default_factory=dict)
    evictions: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def evicted(self, request_id: str, reason: str) -> None:
        self.evictions[request_id] = reason
        while len(self.evictions) > MAX_EVICTIONS:
            self.evictions.popitem(last=False)


@dataclass(eq=False)
class HostedModel:
    loaded: LoadedModel
    runner: Any  # PagedRunner (native) or the emulated engine's step pricer
    shape: KvShape
    tokens_per_block: int
    reserved_bytes: int


class ModelHost:
    """Mixin of :class:`~llmfleet_engine.executor.Executor`: the models half of the engine node."""

    # set by Executor.__init__
    config: object
    device: str
    plan: MemoryPlan
    allocator: BlockAllocator
    storage: KvStorage
    core: EngineCore
    on_models_changed: list[Callable[[tuple[str, ...]], None]]
    _cond: threading.Condition
    _load_lock: threading.Lock
    _models: dict[str, HostedModel]
    _reserved_blocks: int
    _drain_book: DrainBook | None = None  # created on first use (under _cond)

    if TYPE_CHECKING:  # provided by the class this is mixed into
        _requests: dict[str, _HostRequest]

        def _check_open(self) -> None: ...

        def _cancel_model_locked(self, model: HostedModel) -> None: ...

        def _finish_locked(self, state: _HostRequest, reason: FinishReason) -> None: ...

    @property
    def models(self) -> dict[str, LoadedModel]:
        """The loaded models by name (a copy)."""
        with self._cond:
            return {n: m.loaded for n, m in self._models.items()}

    def model_names(self) -> tuple[str, ...]:
        with self._cond:
            return tuple(sorted(self._models))

    def runner(self, model: str) -> PagedRunner:
        """The paged forward of ``model`` (KeyError if it is not loaded)."""
        with self._cond:
            return self._models[model].runner

    @property
    def kv_capacity_bytes(self) -> int:
        """Pool bytes usable for KV: the budget minus every model's reservation."""
        return (self.plan.num_blocks - self._reserved_blocks) * self.plan.block_bytes

    @property
    def watermark_blocks(self) -> int:
        """Blocks kept free when admitting new requests: ``watermark`` of the KV capacity."""
        return int(self.config.watermark * (self.kv_capacity_bytes // self.plan.block_bytes))  # type: ignore[attr-defined]

    def tokens_per_block(self, model: str) -> int:
        return self._models[model].tokens_per_block

    def reserved_bytes(self, model: str) -> int:
        return self._models[model].reserved_bytes

    def load(self, spec: ModelSpec) -> LoadResult:
        """Load ``spec`` (blocking); idempotent for the same source and dtype.

        Raises ``ModelLoadError`` for bad sources, ``ModelConflictError`` when the name is taken by a
        different source, ``ResourceExhaustedError`` when weights + activation do not fit the budget.
        """
        if not spec.name or spec.name.startswith("__"):
            raise ModelLoadError(f"invalid model name {spec.name!r}")
        with self._load_lock:
            self._check_open()
            existing = self._models.get(spec.name)
            if existing is not None:
                if existing.loaded.serves(spec):
                    return LoadResult(existing.loaded, already_loaded=True)
                raise ModelConflictError(
                    f"model {spec.name!r} is already loaded from {existing.loaded.source!r} "
                    f"({existing.loaded.dtype}); unload it first"
                )
            loaded = self._materialize(spec)
            self._install(loaded)
            self._weights_arrive(loaded)
        log.info("loaded model %s from %s in %.2fs", spec.name, spec.source, loaded.load_s)
        self._models_changed()
        return LoadResult(loaded, already_loaded=False)

    async def load_async(self, spec: ModelSpec) -> LoadResult:
        return await asyncio.to_thread(self.load, spec)

    def add_loaded(self, model: LoadedModel) -> None:
        """Register a model loaded elsewhere (``models.load_model``); its name must be free."""
        with self._load_lock:
            self._check_open()
            if model.name in self._models:
                raise ModelConflictError(f"model {model.name!r} is already loaded")
            self._install(model)
        self._models_changed()

    def _materialize(self, spec: ModelSpec) -> LoadedModel:
        """Load ``spec``'s weights and tokenizer onto the device (blocking)."""
        cfg = self.config
        return load_model(
            spec,
            device=self.device,
            cache_dir=cfg.cache_dir,  # type: ignore[attr-defined]
            allow_download=cfg.allow_download,  # type: ignore[attr-defined]
        )

    def _footprint(self, loaded: LoadedModel) -> tuple[KvShape, int]:
        """The model's KV geometry and the bytes it reserves in the pool (weights + peak activation)."""
        config = loaded.model.config
        shape = kv_shape_of(config, loaded.dtype)
        cfg = self.config
        activation = peak_activation_bytes(
            config,
            shape.dtype_bytes,
            cfg.max_prefill_tokens,  # type: ignore[attr-defined]
            cfg.max_batch_requests,  # type: ignore[attr-defined]
        )
        return shape, loaded.weight_bytes + activation

    def _new_runner(self, loaded: LoadedModel) -> PagedRunner:
        """The model's forward over the pool (registered in the storage first)."""
        return PagedRunner(loaded.model, self.storage, loaded.name)

    def _weights_arrive(self, loaded: LoadedModel) -> None:
        """Called once the model's memory is claimed, before it is announced (native: nothing left)."""

    def _install(self, loaded: LoadedModel) -> None:
        """Reserve weights + peak activation in the pool, register the KV view, build the runner."""
        shape, reserve = self._footprint(loaded)
        if shape.bytes_per_token > self.plan.block_bytes:
            raise ResourceExhaustedError(
                f"model {loaded.name!r} needs {shape.bytes_per_token} B of KV per token, more than one "
                f"{self.plan.block_bytes} B block; raise block_bytes"
            )
        seq = f"{RESERVED_MODEL}/{loaded.name}"
        blocks = self.plan.blocks_for_bytes(reserve)
        with self._cond:
            try:
                self.allocator.allocate(seq, RESERVED_MODEL, blocks)
                self._reserved_blocks += blocks
            except OutOfBlocks as e:
                raise ResourceExhaustedError(
                    f"cannot load {loaded.name!r}: weights {loaded.weight_bytes} B + peak activation "
                    f"{reserve - loaded.weight_bytes} B do not fit the engine's free memory "
                    f"({self.allocator.free_blocks * self.plan.block_bytes} B of a {self.plan.budget_bytes} B budget)"
                ) from e
            try:
                t_m = self.allocator.register_model(loaded.name, shape)
                self.storage.register(loaded.name, shape)
                runner = self._new_runner(loaded)
            except Exception:
                self._reserved_blocks -= self.allocator.free(seq)
                with contextlib.suppress(Exception):
                    self.allocator.unregister_model(loaded.name)
                with contextlib.suppress(Exception):
                    self.storage.unregister(loaded.name)
                raise
            self._models[loaded.name] = HostedModel(loaded, runner, shape, t_m, reserve)
            self.core.add_model(loaded.name)
            self.core.watermark_blocks = self.watermark_blocks

    def unload(self, name: str) -> bool:
        """Unload ``name``: cancel its requests (other models keep running), free its KV and reservation.

        Requests of a draining model still running here are evicted (their consumers are told to
        resume elsewhere) instead of cancelled."""
        with self._cond:
            model = self._models.pop(name, None)
            if model is None:
                return False
            book = self._drains()
            why = book.models.pop(name, None)
            if why is not None:
                for r in self._requests.values():
                    if r.model is model and not r.finished:
                        book.evicted(r.request_id, f"{why}; unloaded with the request in flight")
            self.core.remove_model(name)
            self._cancel_model_locked(model)
            while any(self.core.requests.get(rid) is None for rid in self.core.inflight):
                self._cond.wait(0.05)  # its last iteration is still writing the pool
            self.allocator.unregister_model(name)
            self.storage.unregister(name)
            self._reserved_blocks -= self.allocator.free(f"{RESERVED_MODEL}/{name}")
            self.core.watermark_blocks = self.watermark_blocks
        del model
        self._free_memory()
        log.info("unloaded model %s", name)
        self._models_changed()
        return True

    # ------------------------------------------------------------------ draining

    def _drains(self) -> DrainBook:
        with self._cond:
            if self._drain_book is None:
                self._drain_book = DrainBook()
            return self._drain_book

    def begin_drain(self, name: str, reason: str) -> bool:
        """Stop advertising ``name`` and refuse its new requests (``reason`` says why); its running
        requests go on. False if it is not loaded or already draining."""
        with self._cond:
            book = self._drains()
            if name not in self._models or name in book.models:
                return False
            book.models[name] = reason
        log.info("draining model %s: %s", name, reason)
        self._models_changed()
        return True

    def end_drain(self, name: str) -> bool:
        """Serve ``name`` again (it is desired here after all); False if it was not draining."""
        with self._cond:
            if self._drains().models.pop(name, None) is None:
                return False
        log.info("model %s serves again (drain called off)", name)
        self._models_changed()
        return True

    def draining_reason(self, name: str) -> str | None:
        """Why ``name`` refuses new requests (None: it is not draining)."""
        with self._cond:
            return self._drains().models.get(name)

    def serving_model_names(self) -> tuple[str, ...]:
        """Loaded models that take new requests: what the node record advertises."""
        with self._cond:
            draining = self._drains().models
            return tuple(sorted(n for n in self._models if n not in draining))

    def model_request_ids(self, name: str) -> list[str]:
        """Ids of the active requests of model ``name`` (running, waiting or paused)."""
        with self._cond:
            return [rid for rid, r in self._requests.items() if r.req.model == name and not r.finished]

    def evict(self, request_id: str, reason: str) -> bool:
        """End ``request_id`` here so that its consumer resumes it elsewhere (the servicer answers
        UNAVAILABLE with ``reason``); False if it is not active."""
        with self._cond:
            state = self._requests.get(request_id)
            if state is None or state.finished:
                return False
            self._drains().evicted(request_id, reason)
            self._finish_locked(state, FinishReason.CANCELLED)
            self._cond.notify_all()
        return True

    def take_eviction(self, request_id: str) -> str | None:
        """Why ``request_id`` was evicted (once; None if it was not)."""
        with self._cond:
            return self._drains().evictions.pop(request_id, None)

    def reconcile(self, desired: Iterable[ModelSpec]) -> ReconcileResult:
        """Load and unload so that exactly ``desired`` is loaded; failures are reported, not raised."""
        return reconcile_models(
            self, desired, (ModelLoadError, ModelConflictError, ExecutorClosedError, ResourceExhaustedError)
        )

    def _models_changed(self) -> None:
        names = self.model_names()
        for callback in list(self.on_models_changed):
            try:
                callback(names)
            except Exception:
                log.exception("on_models_changed callback failed")

    def _free_memory(self) -> None:
        gc.collect()
        if torch.device(self.device).type == "cuda":
            torch.cuda.empty_cache()
