"""A minimal continuous executor: several loaded models, one torch worker thread, streaming results.

Each worker iteration steps every running request once (a prefill for a new request, one decode step
otherwise; each request owns a ``DynamicCache``), rotating the order for round-robin fairness. At
most ``max_running`` requests run; the rest wait in a FIFO queue, admitted as slots and reserved KV
capacity allow. Results are handed to asyncio with ``loop.call_soon_threadsafe`` into a per-request
queue read through ``RequestStream``. A later paged-KV executor can keep this public interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import inspect
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from llmfleet.types import ModelSpec
from transformers import DynamicCache

from llmfleet_engine.models import DEFAULT_DTYPE, LoadedModel, ModelLoadError, load_model
from llmfleet_engine.sampling import make_generator, select_token
from llmfleet_engine.validation import GenerationRequest, UnknownModelError

log = logging.getLogger(__name__)

BACKEND = "torch"


class FinishReason(enum.IntEnum):
    """Why a stream ended; values equal ``llmfleet.v1.FinishReason``."""

    LENGTH = 1
    STOP = 2
    EOS = 3
    CANCELLED = 4
    ERROR = 5


class ExecutorClosedError(RuntimeError):
    """The executor is shut down."""


class DuplicateRequestError(ValueError):
    """A request with this id is already active."""


class QueueFullError(RuntimeError):
    """The waiting queue is at ``max_waiting``."""


class ModelConflictError(ValueError):
    """A model of this name is already loaded from a different source or dtype."""


@dataclass(frozen=True)
class Usage:
    """Final accounting of a request; ``completion_tokens`` includes resumed tokens."""

    prompt_tokens: int
    completion_tokens: int
    queue_s: float
    ttft_s: float
    latency_s: float


@dataclass(frozen=True)
class Chunk:
    """One stream increment; ``index`` is the completion position of ``token_ids[0]``."""

    request_id: str
    index: int
    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None
    usage: Usage | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class ModelLoad:
    model: str
    running: int
    waiting: int
    kv_tokens: int
    kv_used_bytes: int


@dataclass(frozen=True)
class LoadSnapshot:
    """Engine load at ``timestamp`` (seconds since the epoch)."""

    timestamp: float
    running: int
    waiting: int
    kv_used_bytes: int
    kv_capacity_bytes: int
    tokens_per_s: float
    models: tuple[ModelLoad, ...]


@dataclass(frozen=True)
class LoadResult:
    model: LoadedModel
    already_loaded: bool


@dataclass
class ReconcileResult:
    loaded: list[str] = field(default_factory=list)
    unloaded: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class ExecutorConfig:
    """Executor knobs; ``kv_capacity_bytes`` unset means ``kv_memory_fraction`` of device memory."""

    device: str = "cpu"
    cache_dir: str | Path | None = None
    max_running: int = 8
    max_waiting: int = 1024
    num_threads: int | None = None
    kv_capacity_bytes: int | None = None
    kv_memory_fraction: float = 0.25
    throughput_window_s: float = 10.0
    allow_download: bool = True

    def __post_init__(self) -> None:
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.throughput_window_s <= 0:
            raise ValueError(f"throughput_window_s must be > 0, got {self.throughput_window_s}")


def device_memory_bytes(device: str) -> int:
    """Total memory of ``device``: the GPU's memory for CUDA devices, physical RAM otherwise."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


class IncrementalDetokenizer:
    """Turns a token stream into text deltas without splitting multi-byte characters.

    Decodes a short window of recent tokens twice (before/after the new token) and emits the new
    suffix only once it no longer ends in an incomplete character (U+FFFD). ``context_ids`` (the
    prompt tail) give decoders that strip a leading space the right context.
    """

    def __init__(self, tokenizer: Any, context_ids: Sequence[int] = (), context_window: int = 4) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = list(context_ids)[-context_window:] if context_window else []
        self._prefix = 0
        self._read = len(self._ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _delta(self) -> str:
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        return after[len(before) :] if len(after) > len(before) else ""

    def push(self, token_id: int) -> str:
        """Add a token; returns the newly completed text (possibly empty)."""
        self._ids.append(token_id)
        delta = self._delta()
        if not delta or delta.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        if self._prefix > 64:  # keep the window short
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        return delta

    def flush(self) -> str:
        """Text of tokens still held back (an incomplete character decodes as U+FFFD)."""
        delta = self._delta()
        self._prefix = self._read = len(self._ids)
        return delta


class TextStream:
    """Detokenized completion text with stop strings: never releases text that may start a stop."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), context_ids: Sequence[int] = ()) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, context_ids)
        self._stop = tuple(s for s in stop if s)
        self._pending = ""

    def _holdback(self) -> int:
        """Length of the longest suffix of the pending text that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(s[:k]):
                    best = k
                    break
        return best

    def _cut_at_stop(self) -> int | None:
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        return min(hits) if hits else None

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add a token; returns (text safe to release, whether a stop string matched)."""
        self._pending += self._detok.push(token_id)
        cut = self._cut_at_stop()
        if cut is not None:
            out, self._pending = self._pending[:cut], ""
            return out, True
        release = len(self._pending) - self._holdback()
        out, self._pending = self._pending[:release], self._pending[release:]
        return out, False

    def finish(self) -> str:
        """All remaining text at the end of the stream (cut before a stop string if one matches)."""
        self._pending += self._detok.flush()
        cut = self._cut_at_stop()
        out = self._pending if cut is None else self._pending[:cut]
        self._pending = ""
        return out


@dataclass(eq=False)
class _Request:
    """Executor-internal state of one request (mutated by the worker; bookkeeping under the lock)."""

    req: GenerationRequest
    model: LoadedModel
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Chunk]
    text: TextStream
    generator: torch.Generator | None
    forward_kwargs: dict[str, Any]
    tokens: list[int] = field(default_factory=list)  # completion ids, resumed ones first
    cache: Any = None
    kv_tokens: int = 0
    reserved_bytes: int = 0
    admitted: bool = False
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finished: bool = False

    @property
    def request_id(self) -> str:
        return self.req.request_id


class RequestStream:
    """Async iterator over a request's ``Chunk``s; closing it (or cancelling the reader) cancels it."""

    def __init__(self, executor: Executor, request_id: str, queue: asyncio.Queue[Chunk]) -> None:
        self._executor = executor
        self._queue = queue
        self._done = False
        self.request_id = request_id

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Chunk:
        if self._done:
            raise StopAsyncIteration
        try:
            chunk = await self._queue.get()
        except asyncio.CancelledError:
            self.close()
            raise
        if chunk.final:
            self._done = True
        return chunk

    def close(self) -> None:
        """Cancel the request unless it already finished; further iteration stops."""
        if not self._done:
            self._done = True
            self._executor.cancel(self.request_id)

    async def aclose(self) -> None:
        self.close()

    async def collect(self) -> list[Chunk]:
        """Read the stream to its final chunk."""
        return [chunk async for chunk in self]

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class Executor:
    """Owns the loaded models and runs their requests on one worker thread.

    Thread-safe: ``load``/``unload``/``reconcile`` block (call them via ``asyncio.to_thread``), while
    ``submit`` must be called from a running event loop. ``on_models_changed`` callbacks receive the
    sorted loaded model names after every change, in the thread that made it.
    """

    def __init__(self, config: ExecutorConfig | None = None) -> None:
        self.config = config or ExecutorConfig()
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        self.device = str(torch.device(self.config.device))
        self.backend = BACKEND
        self.memory_bytes = device_memory_bytes(self.device)
        self.kv_capacity_bytes = (
            self.config.kv_capacity_bytes
            if self.config.kv_capacity_bytes is not None
            else int(self.config.kv_memory_fraction * self.memory_bytes)
        )
        self.on_models_changed: list[Callable[[tuple[str, ...]], None]] = []
        self._models: dict[str, LoadedModel] = {}
        self._requests: dict[str, _Request] = {}
        self._waiting: deque[_Request] = deque()
        self._running: deque[_Request] = deque()
        self._reserved_bytes = 0
        self._generated: deque[tuple[float, int]] = deque()
        self._cond = threading.Condition()
        self._load_lock = threading.Lock()
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="llmfleet-executor", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ models

    @property
    def models(self) -> dict[str, LoadedModel]:
        """A copy of the loaded models by name."""
        with self._cond:
            return dict(self._models)

    def model_names(self) -> tuple[str, ...]:
        with self._cond:
            return tuple(sorted(self._models))

    def load(self, spec: ModelSpec) -> LoadResult:
        """Load ``spec`` (blocking). Idempotent for the same source and dtype.

        Raises ``ModelLoadError``/``ModelSourceNotFound`` for bad sources and ``ModelConflictError``
        when the name is taken by a different source.
        """
        if not spec.name:
            raise ModelLoadError("model name is empty")
        with self._load_lock:
            self._check_open()
            existing = self.models.get(spec.name)
            if existing is not None:
                if existing.source == spec.source and existing.dtype == (spec.dtype or DEFAULT_DTYPE):
                    return LoadResult(existing, already_loaded=True)
                raise ModelConflictError(
                    f"model {spec.name!r} is already loaded from {existing.source!r} ({existing.dtype}); "
                    "unload it first"
                )
            loaded = load_model(
                spec,
                device=self.device,
                cache_dir=self.config.cache_dir,
                allow_download=self.config.allow_download,
            )
            with self._cond:
                self._check_open()
                self._models[spec.name] = loaded
        log.info("loaded model %s from %s in %.2fs", spec.name, spec.source, loaded.load_s)
        self._models_changed()
        return LoadResult(loaded, already_loaded=False)

    def add_loaded(self, model: LoadedModel) -> None:
        """Register a model loaded elsewhere (``models.load_model``); its name must be free."""
        with self._cond:
            self._check_open()
            if model.name in self._models:
                raise ModelConflictError(f"model {model.name!r} is already loaded")
            self._models[model.name] = model
        self._models_changed()

    async def load_async(self, spec: ModelSpec) -> LoadResult:
        return await asyncio.to_thread(self.load, spec)

    def unload(self, name: str) -> bool:
        """Unload ``name``, cancelling its requests; False when it was not loaded."""
        with self._cond:
            model = self._models.pop(name, None)
            if model is None:
                return False
            for r in [r for r in self._requests.values() if r.model is model]:
                self._finish_locked(r, FinishReason.CANCELLED)
        del model
        self._free_memory()
        log.info("unloaded model %s", name)
        self._models_changed()
        return True

    def reconcile(self, desired: Iterable[ModelSpec]) -> ReconcileResult:
        """Load and unload so that exactly ``desired`` is loaded; failures are reported, not raised."""
        want = {s.name: s for s in desired}
        result = ReconcileResult()
        for name, model in self.models.items():
            spec = want.get(name)
            stale = spec is None or (spec.source, spec.dtype or DEFAULT_DTYPE) != (model.source, model.dtype)
            if stale and self.unload(name):
                result.unloaded.append(name)
        for name, spec in want.items():
            try:
                if not self.load(spec).already_loaded:
                    result.loaded.append(name)
            except (ModelLoadError, ModelConflictError, ExecutorClosedError) as e:
                result.errors[name] = str(e)
        return result

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

        Raises ``UnknownModelError``, ``DuplicateRequestError``, ``QueueFullError`` or
        ``ExecutorClosedError``.
        """
        loop = asyncio.get_running_loop()
        model = self.models.get(request.model)
        if model is None:
            raise UnknownModelError(request.model, self.model_names())
        sampling = request.sampling
        text = TextStream(model.tokenizer, sampling.stop, context_ids=request.prompt_token_ids)
        stopped = False
        for token in request.resume_token_ids:  # replay what the client already has
            stopped = text.push(token)[1] or stopped
        state = _Request(
            req=request,
            model=model,
            loop=loop,
            queue=asyncio.Queue(),
            text=text,
            generator=None if sampling.greedy else make_generator(sampling.seed),
            forward_kwargs=_forward_kwargs(model.model),
            tokens=list(request.resume_token_ids),
            reserved_bytes=(request.prompt_tokens + sampling.max_tokens) * model.kv_bytes_per_token,
        )
        with self._cond:
            self._check_open()
            if self._models.get(request.model) is not model:
                raise UnknownModelError(request.model, list(self._models))
            if request.request_id in self._requests:
                raise DuplicateRequestError(f"request {request.request_id!r} is already active")
            if len(self._waiting) >= self.config.max_waiting:
                raise QueueFullError(f"waiting queue is full ({self.config.max_waiting} requests)")
            self._requests[request.request_id] = state
            if stopped or len(state.tokens) >= sampling.max_tokens:
                reason = FinishReason.STOP if stopped else FinishReason.LENGTH
                self._finish_locked(state, reason)
            else:
                self._waiting.append(state)
                self._cond.notify()
        return RequestStream(self, request.request_id, state.queue)

    def cancel(self, request_id: str) -> bool:
        """Cancel an active request (final chunk CANCELLED, cache freed); False if unknown/finished."""
        with self._cond:
            state = self._requests.get(request_id)
            if state is None or state.finished:
                return False
            self._finish_locked(state, FinishReason.CANCELLED)
            self._cond.notify()
        return True

    def load_snapshot(self) -> LoadSnapshot:
        now = time.monotonic()
        with self._cond:
            per_model = {
                name: {"running": 0, "waiting": 0, "kv_tokens": 0, "bpt": m.kv_bytes_per_token}
                for name, m in self._models.items()
            }
            for r in self._running:
                if r.req.model in per_model:
                    per_model[r.req.model]["running"] += 1
                    per_model[r.req.model]["kv_tokens"] += r.kv_tokens
            for r in self._waiting:
                if r.req.model in per_model:
                    per_model[r.req.model]["waiting"] += 1
            self._trim_window(now)
            generated = sum(n for _, n in self._generated)
            running, waiting = len(self._running), len(self._waiting)
        models = tuple(
            ModelLoad(
                model=name,
                running=d["running"],
                waiting=d["waiting"],
                kv_tokens=d["kv_tokens"],
                kv_used_bytes=d["kv_tokens"] * d["bpt"],
            )
            for name, d in sorted(per_model.items())
        )
        return LoadSnapshot(
            timestamp=time.time(),
            running=running,
            waiting=waiting,
            kv_used_bytes=sum(m.kv_used_bytes for m in models),
            kv_capacity_bytes=self.kv_capacity_bytes,
            tokens_per_s=generated / self.config.throughput_window_s,
            models=models,
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

    # ------------------------------------------------------------------ worker

    def _work(self) -> None:
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)  # intra-op threads are per calling thread
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._closed and not self._running and not self._waiting:
                        self._cond.wait()
                    if self._closed:
                        return
                    self._admit_locked(time.monotonic())
                    batch = list(self._running)
                    self._running.rotate(-1)
                for state in batch:
                    if not state.finished:
                        self._step(state)

    def _admit_locked(self, now: float) -> None:
        """FIFO admission while a running slot is free and the reserved KV fits (or nothing runs)."""
        while self._waiting and len(self._running) < self.config.max_running:
            head = self._waiting[0]
            if self._running and self._reserved_bytes + head.reserved_bytes > self.kv_capacity_bytes:
                return
            self._waiting.popleft()
            head.admitted = True
            head.scheduled_s = now
            self._reserved_bytes += head.reserved_bytes
            self._running.append(head)

    def _step(self, state: _Request) -> None:
        """One forward pass for ``state`` (prefill or decode) and the resulting chunk."""
        model = state.model
        cache = state.cache  # a local reference: cancel() may drop state.cache meanwhile
        try:
            if cache is None:
                cache = DynamicCache(config=model.model.config)
                ids: Sequence[int] = state.req.prompt_token_ids + tuple(state.tokens)
            else:
                ids = state.tokens[-1:]
            input_ids = torch.tensor([ids], dtype=torch.long, device=model.device)
            out = model.model(
                input_ids=input_ids, past_key_values=cache, use_cache=True, **state.forward_kwargs
            )
            token = select_token(out.logits[0, -1], state.req.sampling, state.generator)
            kv_tokens = cache.get_seq_length()
            del out
        except Exception:
            log.exception("request %s failed in the model step", state.request_id)
            with self._cond:
                if not state.finished:
                    self._finish_locked(state, FinishReason.ERROR)
            return
        reason: FinishReason | None = None
        token_ids: tuple[int, ...] = ()
        if token in model.eos_token_ids:
            text, reason = state.text.finish(), FinishReason.EOS
        else:
            token_ids = (token,)
            text, stopped = state.text.push(token)
            if stopped:
                reason = FinishReason.STOP
            elif len(state.tokens) + 1 >= state.req.sampling.max_tokens:
                text += state.text.finish()
                reason = FinishReason.LENGTH
        now = time.monotonic()
        with self._cond:
            if state.finished:  # cancelled or unloaded meanwhile
                return
            index = len(state.tokens)
            state.tokens.extend(token_ids)
            state.cache, state.kv_tokens = cache, kv_tokens
            if token_ids:
                self._generated.append((now, len(token_ids)))
                self._trim_window(now)
            if state.first_token_s is None:
                state.first_token_s = now
            if reason is None:
                self._emit(state, Chunk(state.request_id, index, token_ids, text))
            else:
                self._finish_locked(state, reason, token_ids=token_ids, text=text, index=index, now=now)

    def _trim_window(self, now: float) -> None:
        horizon = now - self.config.throughput_window_s
        while self._generated and self._generated[0][0] < horizon:
            self._generated.popleft()

    def _finish_locked(
        self,
        state: _Request,
        reason: FinishReason,
        *,
        token_ids: tuple[int, ...] = (),
        text: str = "",
        index: int | None = None,
        now: float | None = None,
    ) -> None:
        """Retire ``state``: free its cache and reservation and emit the final chunk."""
        now = time.monotonic() if now is None else now
        state.finished = True
        state.cache = None
        state.kv_tokens = 0
        self._requests.pop(state.request_id, None)
        if state.admitted:
            self._reserved_bytes -= state.reserved_bytes
            with contextlib.suppress(ValueError):
                self._running.remove(state)
        else:
            with contextlib.suppress(ValueError):
                self._waiting.remove(state)
        arrival = state.req.arrival_s
        usage = Usage(
            prompt_tokens=state.req.prompt_tokens,
            completion_tokens=len(state.tokens),
            queue_s=max(0.0, (state.scheduled_s if state.scheduled_s is not None else now) - arrival),
            ttft_s=max(0.0, state.first_token_s - arrival) if state.first_token_s is not None else 0.0,
            latency_s=max(0.0, now - arrival),
        )
        idx = len(state.tokens) - len(token_ids) if index is None else index
        self._emit(state, Chunk(state.request_id, idx, token_ids, text, reason, usage))

    def _emit(self, state: _Request, chunk: Chunk) -> None:
        try:
            state.loop.call_soon_threadsafe(state.queue.put_nowait, chunk)
        except RuntimeError:  # the consumer's loop is gone: nobody will read this request
            if not state.finished:
                self._finish_locked(state, FinishReason.CANCELLED)


def _forward_kwargs(model: Any) -> dict[str, Any]:
    """Extra forward arguments: compute logits for the last position only when supported."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}
