"""Request lifecycle of the vLLM backend: a request -> vLLM arguments, vLLM's cumulative outputs ->
chunks with the native executor's text semantics, and the submit / drive / cancel / finish machinery
(``VllmRequests``, mixed into ``vllm_backend.VllmExecutor``).

With ``scheduling_policy: priority`` each request carries its priority to vLLM (:func:`vllm_priority`).

Migration is by re-prefill (token transfer): there is no KV export/import; a migrated or resumed request
arrives with ``resume_token_ids`` and is re-prefilled from ``prompt_token_ids + resume_token_ids``
(:func:`engine_prompt`), its completion indices continuing after the resumed tokens
(:class:`CompletionAssembler`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmfleet_engine.outputs import (
    DuplicateRequestError,
    EngineChunk,
    EngineUsage,
    FinishReason,
    QueueFullError,
)
from llmfleet_engine.sampling import SamplingConfig
from llmfleet_engine.stream import RequestStream
from llmfleet_engine.text import TextStream
from llmfleet_engine.validation import GenerationRequest, UnknownModelError
from llmfleet_engine.vllm_compat import (
    VllmApi,
    abort_request,
    close_output_stream,
    engine_queue_s,
)

if TYPE_CHECKING:
    from llmfleet.metrics.engine import EngineMetrics

    from llmfleet_engine.vllm_adapters import VllmAdapters
    from llmfleet_engine.vllm_config import VllmConfig
    from llmfleet_engine.vllm_models import ModelRuntime

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Pure mapping functions (no vLLM needed; unit-tested with plain objects shaped like vLLM's)


def engine_prompt(request: GenerationRequest) -> dict[str, list[int]]:
    """The vLLM prompt (a ``TokensPrompt`` dict): the prompt ids followed by the resumed ids.

    Resuming re-prefills everything the client already has; vLLM then generates only what is left.
    """
    return {"prompt_token_ids": [*request.prompt_token_ids, *request.resume_token_ids]}


def sampling_kwargs(
    sampling: SamplingConfig, resumed: int = 0, eos_token_ids: Iterable[int] = ()
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` of a request that already has ``resumed`` tokens.

    Temperature 0 is greedy (vLLM treats temperature 0 as greedy; top_p is 1 and no seed then);
    ``max_tokens`` counts only the tokens still to generate. EOS follows ``generate``'s rule, as on
    the native backend: vLLM's own EOS (the tokenizer's) is ignored and the model's
    ``eos_token_ids`` stop it instead. vLLM detokenizes only to match stop strings (the adapter makes
    the text itself).
    """
    remaining = sampling.max_tokens - resumed
    if remaining < 1:
        raise ValueError(f"nothing left to generate: max_tokens {sampling.max_tokens}, resumed {resumed}")
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": remaining,
        "stop": list(sampling.stop),
        "ignore_eos": True,
        "stop_token_ids": sorted(eos_token_ids),
        "detokenize": bool(sampling.stop),
        "skip_special_tokens": True,
    }
    if sampling.greedy:
        kwargs.update(temperature=0.0, top_p=1.0, seed=None)
    else:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, seed=sampling.seed)
    return kwargs


def vllm_priority(priority: int, scheduling_policy: str) -> int:
    """vLLM's ``priority`` argument for a request of llmfleet ``priority`` on an engine with
    ``scheduling_policy``: llmfleet runs a higher priority first, vLLM a lower value first, so the value
    is negated; 0 under ``fcfs``, where vLLM schedules in arrival order and a priority means nothing."""
    return -priority if scheduling_policy == "priority" else 0


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


# --------------------------------------------------------------------------------------------------
# Requests in flight


@dataclass(eq=False)
class ActiveRequest:
    """A request in flight on a model's vLLM engine: the adapter's side of it."""

    req: GenerationRequest
    runtime: ModelRuntime
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[EngineChunk]
    assembler: CompletionAssembler
    engine_request_id: str = ""
    lora: Any = None  # its adapter's vLLM LoRARequest (None: the model itself)
    future: concurrent.futures.Future | None = None
    handed_s: float | None = None
    engine_queue_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    cached_tokens: int = 0  # vLLM's num_cached_tokens: prompt tokens its prefix cache held
    finished: bool = False

    @property
    def request_id(self) -> str:
        return self.req.request_id


class VllmRequests:
    """Requests of ``VllmExecutor`` (a mixin; the state is made in ``VllmExecutor.__init__``)."""

    config: VllmConfig
    _api: VllmApi
    _lock: threading.Lock
    _runtimes: dict[str, ModelRuntime]
    _requests: dict[str, ActiveRequest]
    _generated: deque[tuple[float, int]]
    _sequence: itertools.count
    metrics: EngineMetrics | None  # vllm:* counters and histograms (None: not exported)
    # the other parts of VllmExecutor it calls (annotations only: the mixin defines none of them)
    _check_open: Callable[[], None]
    model_names: Callable[[], tuple[str, ...]]
    _engine_died: Callable[[ModelRuntime, BaseException], None]
    adapters: VllmAdapters  # a request naming a LoRA adapter runs on its base with a LoRARequest

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Start a validated request on its model's engine; returns its chunk stream.

        Call from a running event loop. Raises ``UnknownModelError``, ``DuplicateRequestError``,
        ``QueueFullError`` or ``ExecutorClosedError``.
        """
        loop = asyncio.get_running_loop()
        base, lora = self.adapters.route(request.model)  # an adapter runs on its base
        with self._lock:
            self._check_open()
            runtime = self._runtimes.get(base)
        if runtime is None:
            raise UnknownModelError(request.model, self.model_names())
        model = runtime.model
        assembler = CompletionAssembler(request, model.tokenizer, model.eos_token_ids)
        state = ActiveRequest(
            req=request,
            runtime=runtime,
            loop=loop,
            queue=asyncio.Queue(),
            assembler=assembler,
            # unique inside vLLM, so a resubmitted id never meets its predecessor's abort in flight
            engine_request_id=f"{request.request_id}.{next(self._sequence)}",
            lora=lora,
        )
        if lora is not None and runtime.loras is not None:
            runtime.loras.used(lora.lora_int_id)
        with self._lock:
            self._check_open()
            if self._runtimes.get(base) is not runtime:
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

    async def _drive(self, state: ActiveRequest) -> None:
        """Runs in the model's host loop: stream the vLLM request into chunks."""
        engine = state.runtime.engine
        rid = state.engine_request_id
        engine_done = False
        task = asyncio.current_task()
        if task is not None:
            state.runtime.drivers.add(task)
            task.add_done_callback(state.runtime.drivers.discard)
        try:
            model = state.runtime.model
            kwargs = sampling_kwargs(state.req.sampling, len(state.req.resume_token_ids), model.eos_token_ids)
            params = self._api.sampling_params_cls(**kwargs)
            with self._lock:
                if state.finished:
                    return
                state.handed_s = time.monotonic()
            priority = vllm_priority(state.req.priority, self.config.settings.scheduling_policy)
            outputs = engine.generate(
                engine_prompt(state.req), params, rid, lora_request=state.lora, priority=priority
            )
            try:
                async for output in outputs:
                    engine_done = bool(getattr(output, "finished", False))
                    if self._on_output(state, output):
                        break
            finally:
                await close_output_stream(outputs)
            if not engine_done:
                await abort_request(engine, rid)  # we stopped first (stop string, max_tokens)
            with self._lock:
                if not state.finished:  # the engine stream ended without a final output
                    log.error("vLLM ended request %s without a final output", rid)
                    self._finish_locked(state, FinishReason.ERROR)
        except asyncio.CancelledError:
            await abort_request(engine, rid)
            raise
        except Exception as e:
            if engine.errored:  # the engine core died: the model's requests move elsewhere
                self._engine_died(state.runtime, e)
                return
            log.exception("vLLM request %s failed", rid)
            with self._lock:
                if not state.finished:
                    self._finish_locked(state, FinishReason.ERROR)
            await abort_request(engine, rid)

    def _on_output(self, state: ActiveRequest, output: Any) -> bool:
        """Handle one ``RequestOutput``; True when the request is over for the adapter."""
        step = state.assembler.feed(output)
        queued = engine_queue_s(getattr(output, "metrics", None))
        now = time.monotonic()
        with self._lock:
            if state.finished:
                return True
            if queued is not None:
                state.engine_queue_s = queued
            cached = getattr(output, "num_cached_tokens", None)
            if cached:
                state.cached_tokens = int(cached)
            if step is None:
                return False
            metrics, model = self.metrics, state.req.model
            if state.first_token_s is None:
                state.first_token_s = now
                loras = state.runtime.loras
                if (
                    state.lora is not None
                    and loras is not None
                    and state.lora.lora_int_id not in loras.hidden
                ):
                    loras.refresh()  # vLLM holds the adapter now, maybe evicting another
                if metrics is not None:
                    metrics.first_token(model, state.req.prompt_tokens, now - state.req.since_s)
            elif metrics is not None and step.token_ids and state.last_token_s is not None:
                metrics.inter_token(model, now - state.last_token_s)
            state.assembler.commit(step)
            if step.token_ids:
                state.last_token_s = now
                self._generated.append((now, len(step.token_ids)))
                self._trim_window(now)
                if metrics is not None:
                    metrics.tokens(model, len(step.token_ids))
            if step.finish_reason is None:
                self._emit(state, EngineChunk(state.request_id, step.index, step.token_ids, step.text))
                return False
            self._finish_locked(state, step.finish_reason, step=step, now=now)
            return True

    def _finish_locked(
        self,
        state: ActiveRequest,
        reason: FinishReason,
        *,
        step: Step | None = None,
        now: float | None = None,
    ) -> None:
        """Retire ``state`` and emit its final chunk (holding ``self._lock``)."""
        now = time.monotonic() if now is None else now
        state.finished = True
        self._requests.pop(state.request_id, None)
        arrival, since = state.req.arrival_s, state.req.since_s
        first = state.first_token_s
        if state.handed_s is None:
            scheduled = now if first is None else first
        else:
            scheduled = state.handed_s + (state.engine_queue_s or 0.0)
            if first is not None:
                scheduled = min(scheduled, first)
        usage = EngineUsage(
            prompt_tokens=state.req.prompt_tokens,
            completion_tokens=len(state.assembler.tokens),
            queue_s=max(0.0, min(scheduled, now) - arrival),
            ttft_s=max(0.0, first - since) if first is not None else 0.0,
            latency_s=max(0.0, now - since),
            cached_tokens=min(state.cached_tokens, state.req.prompt_tokens),
        )
        if self.metrics is not None:
            self.metrics.finished(
                state.req.model,
                reason.name,
                usage.queue_s,
                usage.latency_s,
                counted=state.handed_s is not None,
            )
        if step is None:
            step = Step(len(state.assembler.tokens), (), "")
        self._emit(state, EngineChunk(state.request_id, step.index, step.token_ids, step.text, reason, usage))

    def _emit(self, state: ActiveRequest, chunk: EngineChunk) -> None:
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
