"""The native executor: several models over one unified paged KV pool, continuous batching.

Each iteration the worker thread asks the local request policy (``llmfleet.policies.request``, a pure
object) for the next batch given the waiting and running requests, the pool and the time; it
allocates KV slots in the ``BlockAllocator`` (preempting by recompute when the pool runs out), runs
ONE forward of that model over the mixed batch with ``PagedRunner`` (attention over ``KvStorage``),
samples, and streams chunks to asyncio with ``loop.call_soon_threadsafe``.

Token bookkeeping per request: ``full = prompt + tokens`` where ``tokens`` are the completion (resumed
ones first). A prefill feeds every token of ``full`` not in the KV; a decode feeds the last sampled
token. After a step ``in_kv = len(full) - 1``: the newest token is sampled but not yet in the KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from llmfleet.kvblocks import BlockAllocator, KvShape, OutOfBlocks
from llmfleet.kvblocks.storage import KvStorage
from llmfleet.policies.engine_policy import make_engine_policy
from llmfleet.policies.request import BatchLimits, PoolView, SchedRequest
from llmfleet.types import ModelSpec

from llmfleet_engine.memory import (
    RESERVED_MODEL,
    MemoryPlan,
    default_budget,
    device_memory_bytes,
    peak_activation_bytes,
    reserved_shape,
)
from llmfleet_engine.models import DEFAULT_DTYPE, LoadedModel, ModelLoadError, load_model
from llmfleet_engine.native.runner import PagedRunner, SeqStep, kv_shape_of
from llmfleet_engine.outputs import (
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
    ResourceExhaustedError,
    Usage,
)
from llmfleet_engine.reconcile import reconcile as reconcile_models
from llmfleet_engine.sampling import make_generator, select_token
from llmfleet_engine.stream import RequestStream
from llmfleet_engine.text import IncrementalDetokenizer, TextStream
from llmfleet_engine.validation import GenerationRequest, UnknownModelError

__all__ = [
    "Chunk",
    "DuplicateRequestError",
    "Executor",
    "ExecutorClosedError",
    "ExecutorConfig",
    "FinishReason",
    "IncrementalDetokenizer",
    "LoadResult",
    "LoadSnapshot",
    "ModelConflictError",
    "ModelLoad",
    "QueueFullError",
    "ReconcileResult",
    "RequestStream",
    "ResourceExhaustedError",
    "TextStream",
    "Usage",
    "device_memory_bytes",
]

log = logging.getLogger(__name__)

BACKEND = "native"
PROFILE_PREFIX = "__profile__/"


@dataclass
class ExecutorConfig:
    """Executor knobs (see the README's engine section for how they interact)."""

    device: str = "cpu"
    cache_dir: str | Path | None = None
    memory_budget_bytes: int | None = None  # weights + activations + KV pool; None: default_budget()
    block_bytes: int = 64 * 1024  # one merged block (all layers x KV heads x T_m tokens of a model)
    watermark: float = 0.01  # fraction of blocks kept free when admitting new requests
    policy: str = "fcfs"  # local request policy: fcfs | doubling_budget
    policy_options: dict[str, Any] = field(default_factory=dict)
    max_running: int = 256  # requests holding KV at once
    max_batch_requests: int = 32
    max_prefill_tokens: int = 4096
    max_waiting: int = 4096
    num_threads: int | None = None
    throughput_window_s: float = 10.0
    allow_download: bool = True

    def __post_init__(self) -> None:
        for name in ("max_running", "max_batch_requests", "max_prefill_tokens", "block_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.throughput_window_s <= 0:
            raise ValueError(f"throughput_window_s must be > 0, got {self.throughput_window_s}")
        if self.block_bytes % 16:
            raise ValueError(f"block_bytes must be a multiple of 16, got {self.block_bytes}")


@dataclass(eq=False)
class _Model:
    loaded: LoadedModel
    runner: PagedRunner
    shape: KvShape
    tokens_per_block: int
    reserved_bytes: int


@dataclass(eq=False)
class _Request:
    """Executor-internal state of one request (bookkeeping under the executor lock)."""

    req: GenerationRequest
    model: _Model
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Chunk]
    text: TextStream
    generator: torch.Generator | None
    sched: SchedRequest
    tokens: list[int] = field(default_factory=list)  # completion ids, resumed ones first
    in_kv: int = 0  # tokens of prompt + completion whose K/V are in the pool
    paused: bool = False  # excluded from scheduling (export / migration in progress)
    attached: bool = True  # False for an imported request until a consumer attaches
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finished: bool = False

    @property
    def request_id(self) -> str:
        return self.req.request_id

    def full_ids(self) -> list[int]:
        return [*self.req.prompt_token_ids, *self.tokens]


@dataclass
class _Plan:
    model: _Model
    batch: Any  # policies.request.Batch
    requests: list[_Request]
    steps: list[SeqStep]


class Executor:
    """Owns the loaded models, the unified KV pool and the worker thread.

    Thread-safe: ``load``/``unload``/``reconcile``/``profile`` block (call them via
    ``asyncio.to_thread``); ``submit`` must be called from a running event loop.
    ``on_models_changed`` callbacks receive the sorted model names after each change.
    """

    supports_kv_transfer = True

    def __init__(self, config: ExecutorConfig | None = None) -> None:
        self.config = config or ExecutorConfig()
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        self.device = str(torch.device(self.config.device))
        self.backend = BACKEND
        self.memory_bytes = device_memory_bytes(self.device)
        budget = self.config.memory_budget_bytes or default_budget(self.device)
        self.plan = MemoryPlan(budget_bytes=budget, block_bytes=self.config.block_bytes)
        if self.plan.num_blocks < 2:
            raise ValueError(
                f"memory budget {budget} B holds fewer than 2 blocks of {self.config.block_bytes} B"
            )
        # watermark=0: the executor applies its watermark to the KV capacity (reservations excluded)
        self.allocator = BlockAllocator(self.plan.num_blocks, self.plan.block_bytes, watermark=0.0)
        self.allocator.register_model(RESERVED_MODEL, reserved_shape(self.plan.block_bytes))
        self.storage = KvStorage(self.plan.num_blocks, self.plan.block_bytes, device=self.device)
        self.policy = make_engine_policy(self.config.policy, **self.config.policy_options)
        self.limits = BatchLimits(
            max_requests=self.config.max_batch_requests, max_prefill_tokens=self.config.max_prefill_tokens
        )
        self.on_models_changed: list[Callable[[tuple[str, ...]], None]] = []
        self.preemptions = 0
        self._reserved_blocks = 0  # pool blocks held by model reservations (weights + activation)
        self._models: dict[str, _Model] = {}
        self._requests: dict[str, _Request] = {}
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._inflight: set[str] = set()
        self._deferred_free: set[str] = set()
        self._jobs: deque[Callable[[], None]] = deque()
        self._outbox: list[tuple[_Request, Chunk]] | None = None
        self._generated: deque[tuple[float, int]] = deque()
        self._cond = threading.Condition()
        self._load_lock = threading.Lock()
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="llmfleet-executor", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ models

    @property
    def models(self) -> dict[str, LoadedModel]:
        """The loaded models by name (a copy)."""
        with self._cond:
            return {n: m.loaded for n, m in self._models.items()}

    def model_names(self) -> tuple[str, ...]:
        with self._cond:
            return tuple(sorted(self._models))

    @property
    def kv_capacity_bytes(self) -> int:
        """Pool bytes usable for KV: the budget minus every model's reservation."""
        return (self.plan.num_blocks - self._reserved_blocks) * self.plan.block_bytes

    @property
    def watermark_blocks(self) -> int:
        """Blocks kept free when admitting new requests: ``watermark`` of the KV capacity."""
        return int(self.config.watermark * (self.kv_capacity_bytes // self.plan.block_bytes))

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
                if (existing.loaded.source, existing.loaded.dtype) == (
                    spec.source,
                    spec.dtype or DEFAULT_DTYPE,
                ):
                    return LoadResult(existing.loaded, already_loaded=True)
                raise ModelConflictError(
                    f"model {spec.name!r} is already loaded from {existing.loaded.source!r} "
                    f"({existing.loaded.dtype}); unload it first"
                )
            loaded = load_model(
                spec,
                device=self.device,
                cache_dir=self.config.cache_dir,
                allow_download=self.config.allow_download,
            )
            self._install(loaded)
        log.info("loaded model %s from %s in %.2fs", spec.name, spec.source, loaded.load_s)
        self._models_changed()
        return LoadResult(loaded, already_loaded=False)

    def add_loaded(self, model: LoadedModel) -> None:
        """Register a model loaded elsewhere (``models.load_model``); its name must be free."""
        with self._load_lock:
            self._check_open()
            if model.name in self._models:
                raise ModelConflictError(f"model {model.name!r} is already loaded")
            self._install(model)
        self._models_changed()

    def _install(self, loaded: LoadedModel) -> None:
        """Reserve weights + peak activation in the pool, register the KV view, build the runner."""
        config = loaded.model.config
        shape = kv_shape_of(config, loaded.dtype)
        if shape.bytes_per_token > self.plan.block_bytes:
            raise ResourceExhaustedError(
                f"model {loaded.name!r} needs {shape.bytes_per_token} B of KV per token, more than one "
                f"{self.plan.block_bytes} B block; raise block_bytes"
            )
        dtype_bytes = shape.dtype_bytes
        reserve = loaded.weight_bytes + peak_activation_bytes(
            config, dtype_bytes, self.config.max_prefill_tokens, self.config.max_batch_requests
        )
        seq = f"{RESERVED_MODEL}/{loaded.name}"
        with self._cond:
            try:
                self.allocator.allocate(seq, RESERVED_MODEL, self.plan.blocks_for_bytes(reserve))
                self._reserved_blocks += self.plan.blocks_for_bytes(reserve)
            except OutOfBlocks as e:
                raise ResourceExhaustedError(
                    f"cannot load {loaded.name!r}: weights {loaded.weight_bytes} B + peak activation "
                    f"{reserve - loaded.weight_bytes} B do not fit the engine's free memory "
                    f"({self.allocator.free_blocks * self.plan.block_bytes} B of a {self.plan.budget_bytes} B budget)"
                ) from e
            try:
                t_m = self.allocator.register_model(loaded.name, shape)
                self.storage.register(loaded.name, shape)
                runner = PagedRunner(loaded.model, self.storage, loaded.name)
            except Exception:
                self._reserved_blocks -= self.allocator.free(seq)
                with contextlib.suppress(Exception):
                    self.allocator.unregister_model(loaded.name)
                with contextlib.suppress(Exception):
                    self.storage.unregister(loaded.name)
                raise
            self._models[loaded.name] = _Model(loaded, runner, shape, t_m, reserve)

    async def load_async(self, spec: ModelSpec) -> LoadResult:
        return await asyncio.to_thread(self.load, spec)

    def unload(self, name: str) -> bool:
        """Unload ``name``: cancel its requests (other models keep running), free its KV and reservation."""
        with self._cond:
            model = self._models.pop(name, None)
            if model is None:
                return False
            for r in [r for r in self._requests.values() if r.model is model]:
                self._finish_locked(r, FinishReason.CANCELLED)
            while any(rid in self._deferred_free for rid in list(self._inflight)):
                self._cond.wait(0.05)  # its last iteration is still writing the pool
            self._flush_deferred_locked()
            self.allocator.unregister_model(name)
            self.storage.unregister(name)
            self._reserved_blocks -= self.allocator.free(f"{RESERVED_MODEL}/{name}")
        del model
        self._free_memory()
        log.info("unloaded model %s", name)
        self._models_changed()
        return True

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

    # ---------------------------------------------------------------- requests

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue a validated request; returns its chunk stream. Call from a running event loop.

        Raises ``UnknownModelError``, ``DuplicateRequestError``, ``QueueFullError``,
        ``ResourceExhaustedError`` (can never fit the pool) or ``ExecutorClosedError``.
        """
        loop = asyncio.get_running_loop()
        with self._cond:
            model = self._models.get(request.model)
        if model is None:
            raise UnknownModelError(request.model, self.model_names())
        self._check_fits(model, request.prompt_tokens + request.sampling.max_tokens)
        state = self._new_state(request, model, loop, list(request.resume_token_ids))
        with self._cond:
            self._check_open()
            if self._models.get(request.model) is not model:
                raise UnknownModelError(request.model, list(self._models))
            if request.request_id in self._requests:
                raise DuplicateRequestError(f"request {request.request_id!r} is already active")
            if len(self._waiting) >= self.config.max_waiting:
                raise QueueFullError(f"waiting queue is full ({self.config.max_waiting} requests)")
            self._requests[request.request_id] = state
            stopped = state.text.stopped_on_replay
            if stopped or len(state.tokens) >= request.sampling.max_tokens:
                self._finish_locked(state, FinishReason.STOP if stopped else FinishReason.LENGTH)
            else:
                self._enqueue_locked(state, time.monotonic())
        return RequestStream(self, request.request_id, state.queue)

    def _new_state(
        self, request: GenerationRequest, model: _Model, loop: asyncio.AbstractEventLoop, tokens: list[int]
    ) -> _Request:
        sampling = request.sampling
        text = TextStream(model.loaded.tokenizer, sampling.stop, context_ids=request.prompt_token_ids)
        text.replay(tokens)
        sched = SchedRequest(
            request_id=request.request_id,
            service=request.group,
            model=request.model,
            arrival_s=request.arrival_s,
            prompt_tokens=request.prompt_tokens + len(tokens),  # known tokens are prefilled together
            max_new_tokens=sampling.max_tokens - len(tokens),
            predicted_output_tokens=request.predicted_output_tokens,
            deadline_s=None if request.deadline_s is None else request.arrival_s + request.deadline_s,
        )
        return _Request(
            req=request,
            model=model,
            loop=loop,
            queue=asyncio.Queue(),
            text=text,
            generator=None if sampling.greedy else make_generator(sampling.seed),
            sched=sched,
            tokens=tokens,
        )

    def _check_fits(self, model: _Model, tokens: int) -> None:
        """A request whose KV can never fit the pool is refused up front (never a hang)."""
        need = model.shape.blocks_for(tokens, self.plan.block_bytes)
        capacity = self.kv_capacity_bytes // self.plan.block_bytes
        usable = capacity - self.watermark_blocks
        if need > usable:
            raise ResourceExhaustedError(
                f"{tokens} tokens of {model.loaded.name!r} need {need} KV blocks "
                f"({need * self.plan.block_bytes} B) but the pool has {usable} usable blocks "
                f"({usable * self.plan.block_bytes} B)"
            )

    def _enqueue_locked(self, state: _Request, now: float) -> None:
        state.sched.phase = "prefill"
        self._waiting.append(state)
        self.policy.on_arrival(state.sched, now)
        self._cond.notify()

    def cancel(self, request_id: str) -> bool:
        """Cancel an active request (final chunk CANCELLED, KV freed); False if unknown/finished."""
        with self._cond:
            state = self._requests.get(request_id)
            if state is None or state.finished:
                return False
            self._finish_locked(state, FinishReason.CANCELLED)
            self._cond.notify()
        return True

    def attach(self, request_id: str) -> RequestStream | None:
        """The stream of an imported (migrated-in) request not yet consumed; None if there is none."""
        with self._cond:
            state = self._requests.get(request_id)
            if state is None or state.attached:
                return None
            state.attached = True
            return RequestStream(self, request_id, state.queue)

    def cancel_if_unattached(self, request_id: str) -> bool:
        """Cancel an imported request nobody attached to (the consumer never came)."""
        with self._cond:
            state = self._requests.get(request_id)
            if state is None or state.attached or state.finished:
                return False
            self._finish_locked(state, FinishReason.CANCELLED)
            return True

    def load_snapshot(self) -> LoadSnapshot:
        now = time.monotonic()
        with self._cond:
            stats = self.allocator.stats()
            per: dict[str, dict[str, int]] = {n: {"running": 0, "waiting": 0} for n in self._models}
            for r in self._running:
                per[r.req.model]["running"] += 1
            for r in self._waiting:
                per[r.req.model]["waiting"] += 1
            self._trim_window(now)
            generated = sum(n for _, n in self._generated)
            running, waiting = len(self._running), len(self._waiting)
            models = tuple(
                ModelLoad(
                    model=name,
                    running=per[name]["running"],
                    waiting=per[name]["waiting"],
                    kv_tokens=stats.models[name].tokens if name in stats.models else 0,
                    kv_used_bytes=(stats.models[name].tokens if name in stats.models else 0)
                    * m.shape.bytes_per_token,
                    kv_blocks=stats.models[name].blocks if name in stats.models else 0,
                    tokens_per_block=m.tokens_per_block,
                )
                for name, m in sorted(self._models.items())
            )
            reserved = self._reserved_blocks
        return LoadSnapshot(
            timestamp=time.time(),
            running=running,
            waiting=waiting,
            kv_used_bytes=sum(m.kv_used_bytes for m in models),
            kv_capacity_bytes=(self.plan.num_blocks - reserved) * self.plan.block_bytes,
            tokens_per_s=generated / self.config.throughput_window_s,
            models=models,
            kv_blocks_used=stats.used_blocks - reserved,
            kv_blocks_total=self.plan.num_blocks - reserved,
            preemptions=self.preemptions,
            kv_fragmentation=stats.fragmentation,
        )

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel every request, stop the worker and drop the models."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for r in list(self._requests.values()):
                self._finish_locked(r, FinishReason.CANCELLED)
            self._cond.notify_all()
        self._worker.join(timeout_s)
        with self._cond:
            self._models.clear()
        self._free_memory()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def _check_open(self) -> None:
        if self._closed:
            raise ExecutorClosedError("executor is closed")

    # ----------------------------------------------------------- worker jobs

    def run_in_worker(self, job: Callable[[], Any], timeout_s: float | None = None) -> Any:
        """Run ``job`` on the worker thread between iterations (exclusive use of the models and pool)."""
        fut: Future = Future()

        def wrapped() -> None:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(job())
                except BaseException as e:
                    fut.set_exception(e)

        with self._cond:
            self._check_open()
            self._jobs.append(wrapped)
            self._cond.notify()
        return fut.result(timeout_s)

    # ------------------------------------------------------------------ worker

    def _work(self) -> None:
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)  # intra-op threads are per calling thread
        with torch.inference_mode():
            while True:
                job: Callable[[], None] | None = None
                plan: _Plan | None = None
                with self._cond:
                    while not self._closed and not self._jobs and not self._runnable_locked():
                        self._cond.wait()
                    if self._closed:
                        return
                    if self._jobs:
                        job = self._jobs.popleft()
                    else:
                        plan = self._plan_locked(time.monotonic())
                        if plan is None:
                            self._cond.wait(0.01)  # nothing fits right now (e.g. paused KV holders)
                if job is not None:
                    job()
                elif plan is not None:
                    self._run(plan)

    def _runnable_locked(self) -> bool:
        return any(not r.paused for r in self._running) or any(not r.paused for r in self._waiting)

    def _pool_view_locked(self) -> PoolView:
        return PoolView(
            free_blocks=self.allocator.free_blocks,
            watermark_blocks=self.watermark_blocks,
            tokens_per_block={n: m.tokens_per_block for n, m in self._models.items()},
        )

    def _plan_locked(self, now: float) -> _Plan | None:
        """Ask the policy for a batch and set up its KV slots (preempting when a decode cannot grow)."""
        running = [r for r in self._running if not r.paused]
        room = self.config.max_running - len(self._running)  # the policy may admit at most this many
        waiting = [r for r in self._waiting if not r.paused][: max(0, room)]
        batch = self.policy.next_batch(
            [r.sched for r in waiting], [r.sched for r in running], self._pool_view_locked(), self.limits, now
        )
        if batch is None:
            return None
        model = self._models[batch.model]
        planned: list[_Request] = []
        steps: list[SeqStep] = []
        for rid in batch.request_ids:
            r = self._requests.get(rid)
            if r is None or r.finished or r.paused:
                continue
            if r.in_kv == 0:
                step = self._prefill_step_locked(r, now)
            else:
                step = self._decode_step_locked(r, planned, now)
            if step is not None:
                planned.append(r)
                steps.append(step)
        if not steps:
            return None
        self._inflight = {r.request_id for r in planned}
        return _Plan(model, batch, planned, steps)

    def _prefill_step_locked(self, r: _Request, now: float) -> SeqStep | None:
        full = r.full_ids()
        try:
            table = self.allocator.allocate(r.request_id, r.req.model, len(full))
        except OutOfBlocks:
            return None  # the pool changed since the policy looked; retry next iteration
        slots = self.allocator.slots(r.request_id, 0, len(full))
        self._waiting.remove(r)
        self._running.append(r)
        r.sched.phase = "decode"
        if r.scheduled_s is None:
            r.scheduled_s = now
        return SeqStep(
            token_ids=full,
            start_pos=0,
            blocks=table.blocks,
            slots_block=[s.block for s in slots],
            slots_offset=[s.offset for s in slots],
        )

    def _decode_step_locked(self, r: _Request, planned: list[_Request], now: float) -> SeqStep | None:
        while True:
            try:
                slot = self.allocator.append_slot(r.request_id)
                break
            except OutOfBlocks:
                candidates = [
                    x
                    for x in self._running
                    if x is not r and x not in planned and not x.paused and x.in_kv > 0
                ]
                by_sched = {id(x.sched): x for x in [*candidates, r]}
                victim = by_sched[id(self.policy.preemption_victim([x.sched for x in [*candidates, r]], now))]
                self._preempt_locked(victim, now)
                if victim is r:
                    return None
        return SeqStep(
            token_ids=[r.tokens[-1]],
            start_pos=r.in_kv,
            blocks=self.allocator.table(r.request_id).blocks,
            slots_block=[slot.block],
            slots_offset=[slot.offset],
        )

    def _preempt_locked(self, r: _Request, now: float) -> None:
        """Preemption by recompute: drop the KV, requeue; the next prefill rebuilds prompt + tokens."""
        self.allocator.free(r.request_id)
        r.in_kv = 0
        self._running.remove(r)
        # The policy contract: fold generated tokens into the prompt so context_tokens == KV length.
        r.sched.prompt_tokens = len(r.req.prompt_token_ids) + len(r.tokens)
        r.sched.max_new_tokens = r.req.sampling.max_tokens - len(r.tokens)
        r.sched.generated = 0
        self.preemptions += 1
        log.info("preempted %s (%d tokens to recompute)", r.request_id, r.sched.prompt_tokens)
        self._enqueue_locked(r, now)

    def _run(self, plan: _Plan) -> None:
        t0 = time.perf_counter()
        try:
            logits = plan.model.runner.forward(plan.steps)
            picked = logits.argmax(dim=-1).tolist()  # greedy rows: one batched argmax
            for i, r in enumerate(plan.requests):
                if not r.req.sampling.greedy:
                    picked[i] = select_token(logits[i], r.req.sampling, r.generator)
        except Exception:
            log.exception("model step failed for %s", [r.request_id for r in plan.requests])
            with self._cond:
                self._inflight.clear()
                for r in plan.requests:
                    if not r.finished:
                        self._finish_locked(r, FinishReason.ERROR)
                self._flush_deferred_locked()
            return
        duration = time.perf_counter() - t0
        now = time.monotonic()
        self._outbox = []
        with self._cond:
            self._inflight.clear()
            self._flush_deferred_locked()
            self.policy.on_iteration(plan.batch, duration, now, [r.sched for r in plan.requests])
            for r, step, token in zip(plan.requests, plan.steps, picked, strict=True):
                if r.finished:
                    continue
                r.in_kv = step.start_pos + len(step.token_ids)
                self._accept_token_locked(r, token, now)
            self._release_requested_locked(now)
            self._cond.notify_all()
        self._flush_outbox()

    def _release_requested_locked(self, now: float) -> None:
        """Drop the KV of requests the policy releases (static mode's recompute slice ends)."""
        take = getattr(self.policy, "take_released", None)
        if take is None:
            return
        for rid in take():
            r = self._requests.get(rid)
            if r is not None and not r.finished and r in self._running and r.in_kv > 0:
                self._preempt_locked(r, now)

    def _accept_token_locked(self, r: _Request, token: int, now: float) -> None:
        reason: FinishReason | None = None
        token_ids: tuple[int, ...] = ()
        if token in r.model.loaded.eos_token_ids:
            text, reason = r.text.finish(), FinishReason.EOS
        else:
            token_ids = (token,)
            text, stopped = r.text.push(token)
            if stopped:
                reason = FinishReason.STOP
            elif len(r.tokens) + 1 >= r.req.sampling.max_tokens:
                text += r.text.finish()
                reason = FinishReason.LENGTH
        index = len(r.tokens)
        r.tokens.extend(token_ids)
        r.sched.generated += len(token_ids)
        if token_ids:
            self._generated.append((now, len(token_ids)))
            self._trim_window(now)
        if r.first_token_s is None:
            r.first_token_s = now
        if reason is None:
            self._emit(r, Chunk(r.request_id, index, token_ids, text))
        else:
            self.policy.on_finish(r.sched, now)
            self._finish_locked(r, reason, token_ids=token_ids, text=text, index=index, now=now)

    def _trim_window(self, now: float) -> None:
        horizon = now - self.config.throughput_window_s
        while self._generated and self._generated[0][0] < horizon:
            self._generated.popleft()

    def _release_kv_locked(self, r: _Request) -> None:
        """Free a request's blocks, after the in-flight iteration if it is still writing them."""
        if r.request_id in self._inflight:
            self._deferred_free.add(r.request_id)
        elif r.request_id in self.allocator:
            self.allocator.free(r.request_id)
        r.in_kv = 0

    def _flush_deferred_locked(self) -> None:
        for rid in self._deferred_free:
            if rid in self.allocator:
                self.allocator.free(rid)
        self._deferred_free.clear()

    def _finish_locked(
        self,
        state: _Request,
        reason: FinishReason,
        *,
        token_ids: tuple[int, ...] = (),
        text: str = "",
        index: int | None = None,
        now: float | None = None,
        migrated_to: str = "",
    ) -> None:
        """Retire ``state``: free its KV and emit the final chunk."""
        now = time.monotonic() if now is None else now
        state.finished = True
        self._requests.pop(state.request_id, None)
        self._release_kv_locked(state)
        for queue in (self._running, self._waiting):
            with contextlib.suppress(ValueError):
                queue.remove(state)
        arrival = state.req.arrival_s
        usage = Usage(
            prompt_tokens=state.req.prompt_tokens,
            completion_tokens=len(state.tokens),
            queue_s=max(0.0, (state.scheduled_s if state.scheduled_s is not None else now) - arrival),
            ttft_s=max(0.0, state.first_token_s - arrival) if state.first_token_s is not None else 0.0,
            latency_s=max(0.0, now - arrival),
        )
        idx = len(state.tokens) - len(token_ids) if index is None else index
        self._emit(state, Chunk(state.request_id, idx, token_ids, text, reason, usage, migrated_to))

    def _emit(self, state: _Request, chunk: Chunk) -> None:
        if self._outbox is not None and threading.current_thread() is self._worker:
            self._outbox.append((state, chunk))  # delivered in one hand-off per loop after the iteration
            return
        self._deliver(state.loop, [(state, chunk)])

    def _deliver(self, loop: asyncio.AbstractEventLoop, items: list[tuple[_Request, Chunk]]) -> None:
        def put_all() -> None:
            for state, chunk in items:
                state.queue.put_nowait(chunk)

        try:
            loop.call_soon_threadsafe(put_all)
        except RuntimeError:  # the consumer's loop is gone: nobody will read these requests
            with self._cond:
                for state, _ in items:
                    if not state.finished:
                        self._finish_locked(state, FinishReason.CANCELLED)

    def _flush_outbox(self) -> None:
        outbox, self._outbox = self._outbox or [], None
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Request, Chunk]]] = {}
        for state, chunk in outbox:
            by_loop.setdefault(state.loop, []).append((state, chunk))
        for loop, items in by_loop.items():
            self._deliver(loop, items)
