"""The native executor: the thread + forward pass + sampling + streaming around the engine core.

Scheduling lives in :class:`llmfleet.engine_core.EngineCore` — the same pure object the simulator
drives: each loop the worker thread asks it for a step (``schedule``: batch chosen by the local policy,
KV slots allocated, preemptions done), runs ONE forward of that model over the step with
``PagedRunner`` (attention over the unified ``KvStorage``), samples, decides which requests finished
(EOS, stop string, max_tokens) and hands the step back (``complete``). Output goes to the consumers
as token ids (``delivery.py``, ``stream.py``): each request's items go into its sink, consumers are
woken with one ``loop.call_soon_threadsafe`` per event loop and iteration (or per stream interval), and
they detokenize on their event loop, unless the request has stop strings (then the worker needs the
text and sends it along).

Token bookkeeping per request: ``full = prompt + tokens`` where ``tokens`` are the completion (resumed
ones first). A prefill feeds every token of ``full``; a decode feeds the last sampled token at position
``CoreRequest.kv_tokens`` (the newest token is sampled but not yet in the KV).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import torch
from llmfleet.engine_core import AdapterGate, EngineCore, StepPlan
from llmfleet.kvblocks import BlockAllocator
from llmfleet.kvblocks.storage import KvStorage
from llmfleet.metrics.engine import EngineMetrics
from llmfleet.policies.engine_policy import make_engine_policy

from llmfleet_engine import profiling
from llmfleet_engine.delivery import Delivery, RateWindow
from llmfleet_engine.executor_config import ExecutorConfig
from llmfleet_engine.live_request import LiveRequest, Outcome, new_live_request, seq_steps
from llmfleet_engine.load_report import LoadReport
from llmfleet_engine.lora.hosting import AdapterHost
from llmfleet_engine.memory import (
    RESERVED_MODEL,
    KvPool,
    MemoryPlan,
    default_budget,
    device_memory_bytes,
    reserved_shape,
)
from llmfleet_engine.migration_ops import MigrationOps
from llmfleet_engine.model_host import HostedModel, ModelHost
from llmfleet_engine.outputs import (
    DuplicateRequestError,
    EngineChunk,
    FinishReason,
    LoadSnapshot,
    QueueFullError,
)
from llmfleet_engine.profiling import ProfileResult
from llmfleet_engine.request_table import RequestTable
from llmfleet_engine.sampling import position_seed, select_token
from llmfleet_engine.stream import FinalText, RequestStream
from llmfleet_engine.validation import GenerationRequest, UnknownModelError

__all__ = ["Executor", "ExecutorConfig", "device_memory_bytes"]

log = logging.getLogger(__name__)
T = TypeVar("T")

BACKEND = "native"


class Executor:
    """Owns the engine core and the worker thread; built from parts that share one request table:

    * ``table`` (:class:`RequestTable`): the active requests and the lock;
    * ``host`` (:class:`ModelHost`): the loaded models, their pool reservations and drains;
    * ``migration`` (:class:`MigrationOps`): pauses, KV export and import;
    * ``load_report`` (:class:`LoadReport`): the load snapshot.

    The executor is a ``backend.EngineBackend``; callers use the part they need: ``host`` (a
    ``backend.ModelHosting``) or ``migration`` (a ``backend.KvMigration``). Thread-safe:
    ``host.load``/``host.unload``/``host.reconcile``/``profile`` block (call them via
    ``asyncio.to_thread``); ``submit`` must be called from a running event loop.
    """

    def __init__(self, config: ExecutorConfig | None = None) -> None:
        self.config = config or ExecutorConfig()
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        self.backend = BACKEND
        self.device, self.memory_bytes, budget = self._device_memory()
        self.plan = MemoryPlan(budget_bytes=budget, block_bytes=self.config.block_bytes or 0)
        if self.plan.num_blocks < 2:
            raise ValueError(
                f"memory budget {budget} B holds fewer than 2 blocks of {self.config.block_bytes} B"
            )
        # watermark=0: the core applies the watermark to the KV capacity (reservations excluded)
        self.allocator = BlockAllocator(self.plan.num_blocks, self.plan.block_bytes, watermark=0.0)
        self.allocator.register_model(RESERVED_MODEL, reserved_shape(self.plan.block_bytes))
        self.storage = self._kv_storage()
        self.pool = KvPool(self.device, self.plan, self.allocator, self.storage)
        self.policy = make_engine_policy(self.config.policy, **self.config.options)
        # LoRA: the core admits a request into a step once its adapter holds a slot of its base's pool
        gate = AdapterGate(lambda r: self.adapters.slots_of(r), lambda r, s: self.adapters.load(r, s))
        self.core = EngineCore(
            self.policy,
            self.allocator,
            self.config.limits,
            watermark_blocks=0,
            preemption=self.config.preemption,
            adapters=gate if self.config.max_loras else None,
        )
        self.metrics: EngineMetrics | None = None  # vllm:* metrics (set by main / attach_metrics)
        self.table = RequestTable()
        self._cond, self._requests = self.table.cond, self.table.requests  # shared, never rebound
        self._jobs: deque[Callable[[], None]] = deque()
        self._delivery = Delivery(self._cancel_unread, self.config.stream_interval_s)
        self._generated = RateWindow(self.config.throughput_window_s)
        self.host = self._new_host()
        self.adapters = self._new_adapters()
        self.migration = self._new_migration()
        self.load_report = LoadReport(self.table, self.core, self.pool, self.host, self._generated)
        self._worker = threading.Thread(target=self._work, name="llmfleet-executor", daemon=True)
        self._delivery.worker = self._worker
        self._worker.start()

    def _new_host(self) -> ModelHost:
        return ModelHost(self.config, self.table, self.core, self.pool, self._finish_locked)

    def _new_adapters(self) -> AdapterHost:
        return AdapterHost(self.table, self.host)

    def _new_migration(self) -> MigrationOps:
        return MigrationOps(
            self.table, self.core, self.pool, self.host, self._finish_locked, self._new_state,
            adapters=self.adapters,
        )  # fmt: skip

    def load_snapshot(self) -> LoadSnapshot:
        """The node's load now (``EngineBackend.load_snapshot``, read by the ``load_report`` part)."""
        return self.load_report.load_snapshot()

    def _device_memory(self) -> tuple[str, int, int]:
        """The device, its memory and the budget (weights + activations + KV pool)."""
        device = str(torch.device(self.config.device))
        return device, device_memory_bytes(device), self.config.memory_budget_bytes or default_budget(device)

    def _kv_storage(self) -> KvStorage:
        """The K/V tensors of the pool (one per block, laid out by ``KvStorage``)."""
        return KvStorage(self.plan.num_blocks, self.plan.block_bytes, device=self.device)

    def attach_metrics(self, metrics: EngineMetrics) -> None:
        """Export this executor's ``vllm:*`` metrics on ``metrics`` (gauges read from load_snapshot)."""
        metrics.attach(self.load_snapshot)
        self.metrics = metrics

    @property
    def preemptions(self) -> int:
        return self.core.preemptions

    @property
    def worker_thread_id(self) -> int | None:
        """The OS id of the worker thread (where forwards, sampling and the metrics hooks run)."""
        return self._worker.native_id

    def with_pool(self, fn: Callable[[BlockAllocator], T]) -> T:
        """Run ``fn(allocator)`` with exclusive use of the pool's block allocator (e.g. scratch sequences
        for profiling; their ids must not collide with request ids)."""
        with self._cond:
            return fn(self.allocator)

    # ---------------------------------------------------------------- requests

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue a validated request; returns its chunk stream. Call from a running event loop.

        Raises ``UnknownModelError`` (a model or LoRA adapter not served here), ``DuplicateRequestError``,
        ``QueueFullError``, ``ResourceExhaustedError`` (can never fit the pool) or ``ExecutorClosedError``.
        A request naming an adapter waits in the core while every slot of its base's adapter pool is
        held by other adapters' running requests.
        """
        loop = asyncio.get_running_loop()
        host = self.host
        with self._cond:
            base = self.adapters.base_of(request.model) or request.model  # an adapter runs on its base
            model = host.hosted.get(base)
        if model is None:
            raise UnknownModelError(request.model, host.model_names())
        host.check_fits(model, request.prompt_tokens + request.sampling.max_tokens)
        state = self._new_state(request, model, loop, list(request.resume_token_ids))
        with self._cond:
            self.table.check_open()
            if host.hosted.get(base) is not model:
                raise UnknownModelError(request.model, list(host.hosted))
            if request.request_id in self._requests:
                raise DuplicateRequestError(f"request {request.request_id!r} is already active")
            if len(self.core.waiting) >= self.config.max_waiting:
                raise QueueFullError(f"waiting queue is full ({self.config.max_waiting} requests)")
            self._requests[request.request_id] = state
            stopped = state.text.stopped_on_replay
            if stopped or len(state.tokens) >= request.sampling.max_tokens:
                self._finish_locked(state, FinishReason.STOP if stopped else FinishReason.LENGTH)
            else:
                self.core.add(state.core, time.monotonic())
                self._cond.notify()
        return RequestStream(self, request.request_id, state.sink)

    def _new_state(
        self,
        request: GenerationRequest,
        model: HostedModel,
        loop: asyncio.AbstractEventLoop,
        tokens: list[int],
    ) -> LiveRequest:
        """The executor's state of ``request``, resumed from ``tokens`` (``live_request``)."""
        return new_live_request(request, model, self._delivery, loop, tokens)

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
            return RequestStream(self, request_id, state.sink)

    def cancel_if_unattached(self, request_id: str) -> bool:
        """Cancel an imported request nobody attached to (the consumer never came)."""
        with self._cond:
            state = self._requests.get(request_id)
            if state is None or state.attached or state.finished:
                return False
            self._finish_locked(state, FinishReason.CANCELLED)
            return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel every request, stop the worker and drop the models."""
        with self._cond:
            if self.table.closed:
                return
            self.table.closed = True
            for r in list(self._requests.values()):
                self._finish_locked(r, FinishReason.CANCELLED)
            self._cond.notify_all()
        self._worker.join(timeout_s)
        with self._cond:
            self.host.hosted.clear()
        self.host.free_memory()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def profile(self, model: str, **sweep: Any) -> ProfileResult:
        """Timed forward sweeps on the worker thread (``profiling.profile``; blocking)."""
        return profiling.profile(self, model, **sweep)

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
            self.table.check_open()
            self._jobs.append(wrapped)
            self._cond.notify()
        return fut.result(timeout_s)

    # ------------------------------------------------------------------ worker

    def _work(self) -> None:
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)  # intra-op threads are per calling thread
        core = self.core
        with torch.inference_mode():
            while True:
                job: Callable[[], None] | None = None
                step: tuple[StepPlan, Any] | None = None
                with self._cond:
                    while not self.table.closed and not self._jobs and not core.has_work():
                        self._delivery.release()  # nothing held back while the worker waits
                        self._cond.wait()
                    if self.table.closed:
                        return
                    if self._jobs:
                        job = self._jobs.popleft()
                    else:
                        step = self._schedule_locked(time.monotonic())
                        if step is None:
                            self._delivery.release()
                            self._cond.wait(0.01)  # nothing fits right now (e.g. paused KV holders)
                if job is not None:
                    self._delivery.release()
                    job()
                elif step is not None:
                    self._run(*step)

    def schedule(self, now: float) -> tuple[StepPlan, Any] | None:
        """The core's next step at ``now`` and the forward inputs of its members, scheduled under the
        lock as the worker schedules it; None when no step can run."""
        with self._cond:
            return self._schedule_locked(now)

    def _schedule_locked(self, now: float) -> tuple[StepPlan, Any] | None:
        """The core's next step and the forward inputs of its members."""
        plan = self.core.schedule(now)
        for r, why in self.core.drain_failed():
            state: LiveRequest = r.payload
            log.warning("request %s cannot be admitted: %s", state.request_id, why)
            self._finish_locked(state, FinishReason.ERROR)
        if plan is None:
            return None
        if plan.prefills:  # reported as phase "prefill" until the step completes
            self.table.prefilling = {r.sched.request_id for r in plan.prefills}
            for r in plan.prefills:
                live: LiveRequest = r.payload
                if live.cached_tokens is None:  # a recompute after preemption keeps the first count
                    live.cached_tokens = r.cached
        for r in plan.preempted:
            log.info("preempted %s (%d tokens to recompute)", r.request_id, r.sched.prompt_tokens)
            if self.metrics is not None:
                self.metrics.preempted(r.sched.model)
        if plan.prefills and self.metrics is not None and self.core.prefix_caching:
            queries = sum([r.sched.prompt_tokens for r in plan.prefills])
            self.metrics.prefix_cache(plan.model, queries, plan.cached_tokens)
        return plan, self._step_inputs(plan, now)

    def _step_inputs(self, plan: StepPlan, now: float) -> Any:
        """What :meth:`_forward` needs of a scheduled step (called under the lock): the members' KV
        slots and token ids."""
        return seq_steps(plan, self.allocator, now)

    def _forward(
        self, plan: StepPlan, members: list[LiveRequest], steps: Any
    ) -> tuple[list[int], float | None]:
        """Run one iteration of ``plan`` (outside the lock): each member's next token, and the
        iteration's duration when it is not the wall time the call took (None: measure it)."""
        logits = members[0].model.runner.forward(steps)
        picked = logits.argmax(dim=-1).tolist()  # greedy rows: one batched argmax
        for i, r in enumerate(members):
            if not r.req.sampling.greedy:
                if r.req.sampling.seed is not None and r.generator is not None:
                    r.generator.manual_seed(position_seed(r.req.sampling.seed, len(r.tokens)))
                picked[i] = select_token(logits[i], r.req.sampling, r.generator)
        return picked, None

    def _run(self, plan: StepPlan, steps: Any) -> None:
        members: list[LiveRequest] = [r.payload for r in plan.members]
        t0 = time.perf_counter()
        try:
            picked, priced = self._forward(plan, members, steps)
        except Exception:
            log.exception("model step failed for %s", [r.request_id for r in members])
            with self._cond:
                self.core.complete(
                    plan, time.monotonic(), 0.0, produced=[0] * len(members)
                )  # nothing produced
                self.table.prefilling = frozenset()
                for r in members:
                    if not r.finished:
                        self._finish_locked(r, FinishReason.ERROR)
                self._cond.notify_all()
            return
        duration = time.perf_counter() - t0 if priced is None else priced
        now = time.monotonic()
        delivery = self._delivery
        given = delivery.begin()  # requests given output in this iteration: woken after it
        metrics = self.metrics
        # the step's inter-token latencies, as previous token time -> requests (one entry in a steady
        # batch): one metrics call per step instead of one per token
        previous: dict[float, int] = {}
        with self._cond:
            eos = members[0].model.loaded.eos_token_ids
            outcomes = []
            n = 0
            for r, tok in zip(members, picked, strict=True):
                if (
                    r.worker_text
                    or r.finished
                    or tok in eos
                    or len(r.tokens) + 1 >= r.req.sampling.max_tokens
                ):
                    outcome = self._accept_token_locked(r, tok, now)
                    if outcome is not None:
                        outcomes.append((r, outcome))
                    continue
                # the common case: one more token id, for the consumer to detokenize
                if r.first_token_s is None:
                    r.first_token_s = now
                    delivery.urgent()  # time to first token is not held back
                if metrics is not None:
                    last = r.last_token_s
                    if last is None:
                        metrics.first_token(r.req.model, r.req.prompt_tokens, now - r.req.since_s)
                    else:
                        previous[last] = previous.get(last, 0) + 1
                    r.last_token_s = now
                r.tokens.append(tok)
                r.sink.items.append(tok)
                given.append(r)
                n += 1
            if n:
                self._generated.add(now, n)
                if metrics is not None:  # a step runs one model: every member's is the first's
                    metrics.decode_step(members[0].req.model, now, previous, n)
            self.core.complete(plan, now, duration, finished=[r.core for r, _ in outcomes])
            if self.table.prefilling:
                self.table.prefilling = frozenset()
            for r, (reason, token_ids, text, index) in outcomes:
                self._finish_locked(
                    r, reason, token_ids=token_ids, text=text, index=index, now=now, flush=text is None
                )
            self._cond.notify_all()
        delivery.end()

    def _accept_token_locked(self, r: LiveRequest, token: int, now: float) -> Outcome | None:
        """Record ``token``; emit it, or return how the request finished (the caller retires it after
        the core has seen the step; see ``LiveRequest.take_token``)."""
        if r.finished:
            return None
        reason, token_ids, text, index = r.take_token(token)
        if token_ids:
            self._generated.add(now, 1)
        if self.metrics is not None:
            r.token_metrics(self.metrics, now, produced=1 if token_ids else 0)
        first = r.first_token_s is None
        if first:
            r.first_token_s = now
        if reason is None:
            item = EngineChunk(r.request_id, index, token_ids, text or "") if r.worker_text else token
            self._delivery.emit(r, item, urgent=first)
            return None
        return reason, token_ids, text, index

    def _finish_locked(
        self,
        state: LiveRequest,
        reason: FinishReason,
        *,
        token_ids: tuple[int, ...] = (),
        text: str | None = "",
        index: int | None = None,
        now: float | None = None,
        migrated_to: str = "",
        flush: bool = False,
    ) -> None:
        """Retire ``state``: out of the core (KV freed, after the step in flight if it is a member)
        and the final chunk emitted (``flush``: the consumer's detokenizer adds what it holds)."""
        now = time.monotonic() if now is None else now
        state.finished = True
        self._requests.pop(state.request_id, None)
        self.migration.forget(state.request_id)
        if self.core.requests.get(state.request_id) is state.core:
            self.core.drop(state.request_id)
        usage = state.usage(now)
        if self.metrics is not None:
            self.metrics.finished(
                state.req.model, reason.name, usage.queue_s, usage.latency_s, state.scheduled_s is not None
            )
        idx = len(state.tokens) - len(token_ids) if index is None else index
        chunk = EngineChunk(state.request_id, idx, token_ids, text or "", reason, usage, migrated_to)
        consumer_text = not state.worker_text and (token_ids or flush)
        self._delivery.emit(state, FinalText(chunk, flush) if consumer_text else chunk, urgent=True)

    def _cancel_unread(self, states: list[LiveRequest]) -> None:
        """Their consumer's event loop is gone: nobody will read these requests."""
        with self._cond:
            for state in states:
                if not state.finished:
                    self._finish_locked(state, FinishReason.CANCELLED)
