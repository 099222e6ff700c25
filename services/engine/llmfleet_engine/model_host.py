r"""The executor's model host (the ``host`` part of :class:`~llmfleet_engine.executor.Executor`,
``backend.ModelHosting``): load/unload models into the unified pool (weights + peak activation
reserved as pool blocks, a KV view registered per model), reconcile to a desired set, and drain a model
before its unload.

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
from typing import TYPE_CHECKING

import torch
from llmfleet.engine_core import EngineCore
from llmfleet.kvblocks import KvShape, OutOfBlocks
from llmfleet.kvblocks.pool import watermark_blocks
from llmfleet.types import ModelSpec

from llmfleet_engine.executor_config import ExecutorConfig
from llmfleet_engine.hosted_model import HostedModel
from llmfleet_engine.lora import AdapterPool, pool_bytes
from llmfleet_engine.memory import RESERVED_MODEL, KvPool, peak_activation_bytes
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

if TYPE_CHECKING:
    from llmfleet_engine.request_table import RequestTable, Retire


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
class ModelHost:
    """The models half of the engine node. Holds the hosted models, the blocks their reservations take
    and the drains; reads and writes them under the request table's lock. Subclasses (the emulated
    engine) override how a model is materialized, sized, run and freed (``_materialize``,
    ``_footprint``, ``_new_runner``, ``_weights_arrive``, ``free_memory``)."""

    config: ExecutorConfig
    table: RequestTable
    core: EngineCore
    pool: KvPool
    retire: Retire
    hosted: dict[str, HostedModel] = field(default_factory=dict, init=False)
    reserved_blocks: int = field(default=0, init=False)  # pool blocks held by model reservations
    drains: DrainBook = field(default_factory=DrainBook, init=False)
    on_models_changed: list[Callable[[tuple[str, ...]], None]] = field(default_factory=list, init=False)
    _load_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def models(self) -> dict[str, LoadedModel]:
        """The loaded models by name (a copy)."""
        with self.table.cond:
            return {n: m.loaded for n, m in self.hosted.items()}

    def model_names(self) -> tuple[str, ...]:
        with self.table.cond:
            return tuple(sorted(self.hosted))

    def runner(self, model: str) -> PagedRunner:
        """The paged forward of ``model`` (KeyError if it is not loaded)."""
        with self.table.cond:
            return self.hosted[model].runner

    @property
    def kv_capacity_bytes(self) -> int:
        """Pool bytes usable for KV: the budget minus every model's reservation."""
        return (self.pool.plan.num_blocks - self.reserved_blocks) * self.pool.plan.block_bytes

    @property
    def watermark_blocks(self) -> int:
        """Blocks kept free when admitting new requests: ``watermark`` of the KV capacity."""
        return watermark_blocks(self.kv_capacity_bytes // self.pool.plan.block_bytes, self.config.watermark)

    def check_fits(self, model: HostedModel, tokens: int) -> None:
        """A request whose KV can never fit the pool is refused up front (never a hang)."""
        block = self.pool.plan.block_bytes
        need = model.shape.blocks_for(tokens, block)
        usable = self.kv_capacity_bytes // block - self.watermark_blocks
        if need > usable:
            raise ResourceExhaustedError(
                f"{tokens} tokens of {model.loaded.name!r} need {need} KV blocks "
                f"({need * block} B) but the pool has {usable} usable blocks ({usable * block} B)"
            )

    def tokens_per_block(self, model: str) -> int:
        return self.hosted[model].tokens_per_block

    def reserved_bytes(self, model: str) -> int:
        return self.hosted[model].reserved_bytes

    def load(self, spec: ModelSpec) -> LoadResult:
        """Load ``spec`` (blocking); idempotent for the same source and dtype.

        Raises ``ModelLoadError`` for bad sources, ``ModelConflictError`` when the name is taken by a
        different source, ``ResourceExhaustedError`` when weights + activation do not fit the budget.
        """
        if not spec.name or spec.name.startswith("__"):
            raise ModelLoadError(f"invalid model name {spec.name!r}")
        with self._load_lock:
            self.table.check_open()
            existing = self.hosted.get(spec.name)
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
            self.table.check_open()
            if model.name in self.hosted:
                raise ModelConflictError(f"model {model.name!r} is already loaded")
            self._install(model)
        self._models_changed()

    def _materialize(self, spec: ModelSpec) -> LoadedModel:
        """Load ``spec``'s weights and tokenizer onto the device (blocking)."""
        cfg = self.config
        return load_model(
            spec,
            device=self.pool.device,
            cache_dir=cfg.cache_dir,
            allow_download=cfg.allow_download,
        )

    def _footprint(self, loaded: LoadedModel) -> tuple[KvShape, int]:
        """The model's KV geometry and the bytes it reserves in the pool (weights + peak activation, and
        its adapter pool's weights when LoRA is on)."""
        config = loaded.model.config
        shape = kv_shape_of(config, loaded.dtype)
        cfg = self.config
        activation = peak_activation_bytes(
            config,
            shape.dtype_bytes,
            cfg.max_prefill_tokens,
            cfg.max_batch_requests,
        )
        adapters = pool_bytes(loaded.model, cfg.max_loras, cfg.max_lora_rank) if cfg.max_loras else 0
        return shape, loaded.weight_bytes + activation + adapters

    def _new_runner(self, loaded: LoadedModel) -> PagedRunner:
        """The model's forward over the pool (registered in the storage first), with an adapter pool
        attached to its layers when LoRA is on (``max_loras``)."""
        cfg = self.config
        lora = None
        if cfg.max_loras:
            lora = AdapterPool.attach(loaded.model, max_adapters=cfg.max_loras, max_rank=cfg.max_lora_rank)
        return PagedRunner(loaded.model, self.pool.storage, loaded.name, lora=lora)

    def _weights_arrive(self, loaded: LoadedModel) -> None:
        """Called once the model's memory is claimed, before it is announced (native: nothing left)."""

    def _install(self, loaded: LoadedModel) -> None:
        """Reserve weights + peak activation in the pool, register the KV view, build the runner."""
        shape, reserve = self._footprint(loaded)
        if shape.bytes_per_token > self.pool.plan.block_bytes:
            raise ResourceExhaustedError(
                f"model {loaded.name!r} needs {shape.bytes_per_token} B of KV per token, more than one "
                f"{self.pool.plan.block_bytes} B block; raise block_bytes"
            )
        seq = f"{RESERVED_MODEL}/{loaded.name}"
        blocks = self.pool.plan.blocks_for_bytes(reserve)
        with self.table.cond:
            try:
                self.pool.allocator.allocate(seq, RESERVED_MODEL, blocks)
                self.reserved_blocks += blocks
            except OutOfBlocks as e:
                raise ResourceExhaustedError(
                    f"cannot load {loaded.name!r}: weights {loaded.weight_bytes} B + peak activation "
                    f"{reserve - loaded.weight_bytes} B do not fit the engine's free memory "
                    f"({self.pool.allocator.free_blocks * self.pool.plan.block_bytes} B of a {self.pool.plan.budget_bytes} B budget)"
                ) from e
            try:
                t_m = self.pool.allocator.register_model(loaded.name, shape)
                self.pool.storage.register(loaded.name, shape)
                runner = self._new_runner(loaded)
            except Exception:
                self.reserved_blocks -= self.pool.allocator.free(seq)
                with contextlib.suppress(Exception):
                    self.pool.allocator.unregister_model(loaded.name)
                with contextlib.suppress(Exception):
                    self.pool.storage.unregister(loaded.name)
                raise
            self.hosted[loaded.name] = HostedModel(loaded, runner, shape, t_m, reserve)
            self.core.add_model(loaded.name)
            self.core.watermark_blocks = self.watermark_blocks

    def unload(self, name: str) -> bool:
        """Unload ``name``: cancel its requests (other models keep running), free its KV and reservation.

        Requests of a draining model still running here are evicted (their consumers are told to
        resume elsewhere) instead of cancelled."""
        with self.table.cond:
            model = self.hosted.pop(name, None)
            if model is None:
                return False
            book = self.drains
            why = book.models.pop(name, None)
            if why is not None:
                for r in self.table.requests.values():
                    if r.model is model and not r.finished:
                        book.evicted(r.request_id, f"{why}; unloaded with the request in flight")
            self.core.remove_model(name)
            for r in [r for r in self.table.requests.values() if r.model is model]:
                self.retire(r, FinishReason.CANCELLED)
            while any(self.core.requests.get(rid) is None for rid in self.core.inflight):
                self.table.cond.wait(0.05)  # its last iteration is still writing the pool
            self.pool.allocator.unregister_model(name)
            self.pool.storage.unregister(name)
            self.reserved_blocks -= self.pool.allocator.free(f"{RESERVED_MODEL}/{name}")
            self.core.watermark_blocks = self.watermark_blocks
        del model
        self.free_memory()
        log.info("unloaded model %s", name)
        self._models_changed()
        return True

    # ------------------------------------------------------------------ draining

    def begin_drain(self, name: str, reason: str) -> bool:
        """Stop advertising ``name`` and refuse its new requests (``reason`` says why); its running
        requests go on. False if it is not loaded or already draining."""
        with self.table.cond:
            book = self.drains
            if name not in self.hosted or name in book.models:
                return False
            book.models[name] = reason
        log.info("draining model %s: %s", name, reason)
        self._models_changed()
        return True

    def end_drain(self, name: str) -> bool:
        """Serve ``name`` again (it is desired here after all); False if it was not draining."""
        with self.table.cond:
            if self.drains.models.pop(name, None) is None:
                return False
        log.info("model %s serves again (drain called off)", name)
        self._models_changed()
        return True

    def draining_reason(self, name: str) -> str | None:
        """Why ``name`` refuses new requests (None: it is not draining)."""
        with self.table.cond:
            return self.drains.models.get(name)

    def serving_model_names(self) -> tuple[str, ...]:
        """Loaded models that take new requests: what the node record advertises."""
        with self.table.cond:
            draining = self.drains.models
            return tuple(sorted(n for n in self.hosted if n not in draining))

    def model_request_ids(self, name: str) -> list[str]:
        """Ids of the active requests of model ``name`` (running, waiting or paused), its LoRA adapters'
        requests among them (they run on it and leave with it)."""
        with self.table.cond:
            model = self.hosted.get(name)
            return [rid for rid, r in self.table.requests.items() if r.model is model and not r.finished]

    def evict(self, request_id: str, reason: str) -> bool:
        """End ``request_id`` here so that its consumer resumes it elsewhere (the servicer answers
        UNAVAILABLE with ``reason``); False if it is not active."""
        with self.table.cond:
            state = self.table.requests.get(request_id)
            if state is None or state.finished:
                return False
            self.drains.evicted(request_id, reason)
            self.retire(state, FinishReason.CANCELLED)
            self.table.cond.notify_all()
        return True

    def take_eviction(self, request_id: str) -> str | None:
        """Why ``request_id`` was evicted (once; None if it was not)."""
        with self.table.cond:
            return self.drains.evictions.pop(request_id, None)

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

    def free_memory(self) -> None:
        """Give the memory of dropped models back (native: collect, empty the CUDA cache)."""
        gc.collect()
        if torch.device(self.pool.device).type == "cuda":
            torch.cuda.empty_cache()
