"""Scheduler gRPC shell: validate, look the service up, start or attach to a request, relay chunks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from llmfleet.api.v1 import common_pb2, engine_pb2, scheduler_pb2, scheduler_pb2_grpc
from llmfleet.metrics.control import SchedulerMetrics
from llmfleet.policies.capacity.priority import request_priority
from llmfleet.rpc.mux import SUBMIT_MANY, Emit, StreamRefused, serve_many
from llmfleet.security import ApiKey
from llmfleet.security.grpc_auth import caller_key
from llmfleet.security.limit_shares import KeyShares
from llmfleet.security.rate_limits import KeyRateLimiter, RateLimited
from llmfleet.security.settings import current as current_security
from llmfleet.spec.services import ServiceSpec
from llmfleet.token_estimate import PromptTokens, approx_token_count

from llmfleet_scheduler.admission import Admission, Overloaded
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.journal import Journal, RequestFailed, RequestRecord
from llmfleet_scheduler.priorities import RequestClass, RequestClasses
from llmfleet_scheduler.readiness import Readiness
from llmfleet_scheduler.validation import InvalidField, validate_submit

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    """What the servicer uses of the ``llmfleet_scheduler.relay.Relay``: its metrics, and a request's
    run (dispatch, relay, failover) until it ends."""

    @property
    def metrics(self) -> SchedulerMetrics: ...

    async def run(
        self, rec: RequestRecord, req: engine_pb2.GenerateRequest, deadline: float | None, /
    ) -> None: ...


@dataclass
class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    directory: ClusterDirectory
    relay: Dispatcher
    journal: Journal = field(default_factory=Journal)
    orphan_grace_s: float = 2.0  # a request nobody listens to for this long is cancelled
    admission: Admission = field(default_factory=Admission)
    readiness: Readiness | None = None  # ready = servable (None: ready once connected to etcd)
    key_limits: KeyRateLimiter = field(default_factory=KeyRateLimiter)  # API keys' rate limits
    # this replica's shares of the keys' limits (None: it enforces them whole, as if alone)
    key_shares: KeyShares | None = None
    # live requests' priorities and keys, which the capacity gate reads (None: one on the relay's metrics)
    classes: RequestClasses | None = None
    # the prompt-token estimate for rate limits, admission and dispatch: the relay's, which its engines'
    # counts scale
    prompt_tokens: PromptTokens = field(default_factory=PromptTokens)
    _reapers: dict[str, asyncio.Task] = field(default_factory=dict)

    async def Submit(self, request: scheduler_pb2.SubmitRequest, context: grpc.aio.ServicerContext):
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        try:
            key = caller_key(current_security().key_store, context)
            rec = self.open_request(request, deadline, key)
        except InvalidField as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except RequestFailed as e:
            await context.abort(e.code, e.details, e.trailing_metadata())
        try:
            async for chunk in self.follow(rec):
                yield chunk
        except RequestFailed as e:
            await context.abort(e.code, e.details)

    async def SubmitMany(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.SubmitCommands],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[common_pb2.ChunkBatch]:
        """Submit's streams multiplexed on one call (``llmfleet.rpc.mux``): the SDK's path."""
        key = caller_key(current_security().key_store, context)

        async def submit(request: scheduler_pb2.SubmitRequest, timeout_s: float | None, emit: Emit) -> None:
            await self.submit_into(request, timeout_s, key, emit)

        async for batch in serve_many(request_iterator, submit, method=SUBMIT_MANY, name="SubmitMany"):
            yield batch

    async def submit_into(
        self, request: scheduler_pb2.SubmitRequest, timeout_s: float | None, key: ApiKey | None, emit: Emit
    ) -> None:
        """One Submit whose chunks go to ``emit`` as the journal gets them (no task wakes per token);
        ``StreamRefused`` with the status Submit ends with. A listener like ``follow``'s."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            rec = self.open_request(request, deadline, key)
        except InvalidField as e:
            raise StreamRefused(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        except RequestFailed as e:
            raise StreamRefused(e.code, e.details, e.retry_after_s) from None
        try:
            await self.stream_into(rec, emit)
        except RequestFailed as e:
            raise StreamRefused(e.code, e.details, e.retry_after_s) from None

    async def stream_into(self, rec: RequestRecord, emit: Emit) -> None:
        """The request's chunks (then its final chunk; or RequestFailed) into ``emit`` as the journal
        gets them, as one listener like ``follow``'s: no task wake per chunk."""
        rec.subscribers += 1
        self._cancel_reaper(rec.request_id)
        try:
            await rec.stream_to(emit)
        finally:
            self._unsubscribe(rec)

    def __post_init__(self) -> None:
        m = self.relay.metrics
        if self.admission.observe is None:
            self.admission.observe = lambda service, n: m.waiting.labels(service).set(n)
        if self.classes is None:
            self.classes = RequestClasses(m)

    def open_request(
        self, request: scheduler_pb2.SubmitRequest, deadline: float | None, key: ApiKey | None = None
    ) -> RequestRecord:
        """The one entry point of a submission (gRPC Submit and the HTTP API): validate, check the
        caller's API key may use the service and is within its rate limits, then start the request
        (admission, journal, relay: dispatch and failover) or attach to the one with the same id.
        Raises InvalidField, or RequestFailed (UNAVAILABLE, NOT_FOUND, ALREADY_EXISTS,
        PERMISSION_DENIED, RESOURCE_EXHAUSTED)."""
        validate_submit(request)
        if key is not None and not key.allows(request.service):
            self._rejected(request.service, "forbidden")
            raise RequestFailed(
                grpc.StatusCode.PERMISSION_DENIED,
                f"service: API key {key.name!r} may not use service {request.service!r}",
            )
        raw = approx_token_count(request.prompt)  # the prompt's estimate before scaling: made once
        counted = self._rate_limit(key, request, raw) if key is not None and key.limits is not None else 0
        rid = request.request_id or uuid.uuid4().hex
        rec = self.journal.get(rid)
        if rec is None and counted:
            rec = self._start_counted(rid, request, deadline, key, counted, raw)
        elif rec is None:
            rec = self._start(rid, request, deadline, key, raw)
        elif rec.fingerprint != _fingerprint(request):
            raise RequestFailed(
                grpc.StatusCode.ALREADY_EXISTS, f"request_id {rid!r} was already used for a different request"
            )
        elif counted and key is not None:  # attached to the request already there: generates nothing
            self.key_limits.give_back(key.name, counted)
        return rec

    async def follow(self, rec: RequestRecord) -> AsyncIterator[common_pb2.TokenChunk]:
        """The request's chunks (then its final chunk, or RequestFailed) as one listener; a request
        whose every listener left is cancelled after ``orphan_grace_s``."""
        rec.subscribers += 1
        self._cancel_reaper(rec.request_id)
        try:
            async for chunk in rec.follow():
                yield chunk
        finally:
            self._unsubscribe(rec)

    def _unsubscribe(self, rec: RequestRecord) -> None:
        rec.subscribers -= 1
        if rec.subscribers == 0 and not rec.done:
            self._reapers[rec.request_id] = asyncio.create_task(self._reap(rec))

    def _start(
        self,
        rid: str,
        request: scheduler_pb2.SubmitRequest,
        deadline: float | None,
        key: ApiKey | None,
        raw: int,
    ) -> RequestRecord:
        """Admit, journal and relay a new request; ``raw``: its prompt's regex estimate
        (:func:`approx_token_count`), which the model's engines' counts scale."""
        if not self.directory.ready:
            raise RequestFailed(grpc.StatusCode.UNAVAILABLE, "scheduler is not connected to etcd yet; retry")
        spec = self.directory.services().get(request.service)
        if spec is None:
            known = ", ".join(sorted(self.directory.services())) or "none"
            raise RequestFailed(
                grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r} (known: {known})"
            )
        sampling = common_pb2.SamplingParams()
        sampling.CopyFrom(request.sampling)
        if not sampling.HasField("max_tokens"):
            sampling.max_tokens = spec.max_tokens
        if len(request.resume_token_ids) > sampling.max_tokens:
            raise InvalidField(
                "resume_token_ids",
                f"has {len(request.resume_token_ids)} tokens; the request ends at {sampling.max_tokens}",
            )
        if len(request.resume_token_ids) == sampling.max_tokens:  # every token arrived, only the end was lost
            return self._complete(rid, spec, request, raw)
        cls = self._class(request, spec, key, sampling.max_tokens)
        assert self.classes is not None
        estimate = self.prompt_tokens.estimate(spec.model, raw)
        try:
            ticket = self.admission.admit(
                spec.name,
                estimate + sampling.max_tokens,
                spec.max_waiting,
                spec.max_queued_tokens,
                cls.priority,
                cls.key,
            )
        except Overloaded as e:
            self._rejected(spec.name, "overloaded")
            self.classes.count(cls, "refused")
            raise RequestFailed(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e), e.retry_after_s) from None
        self.classes.add(rid, cls)
        gen = engine_pb2.GenerateRequest(
            request_id=rid,
            model=spec.model,
            prompt=request.prompt,
            sampling=sampling,
            service=spec.name,
            deadline_s=spec.deadline_s,
            priority=cls.priority,
            tenant=cls.key,
        )
        prefix = tuple(request.resume_token_ids)
        rec = RequestRecord(
            request_id=rid,
            service=spec.name,
            model=spec.model,
            fingerprint=_fingerprint(request),
            release=ticket.release,
            prefix_token_ids=prefix,
            n_tokens=len(prefix),
            prompt_estimate=estimate,
            prompt_raw=raw,
            session=request.session,
        )
        self.journal.add(rec)
        rec.driver = asyncio.create_task(self.relay.run(rec, gen, deadline), name=f"relay-{rid}")
        rec.driver.add_done_callback(lambda _t: ticket.release())  # however the driver ended
        classes = self.classes
        rec.driver.add_done_callback(lambda _t: classes.end(rid, rec.n_tokens - len(prefix)))
        # A failed request was not served: forget it so a retry with the same id runs afresh
        # (followers already attached still see the error).
        rec.driver.add_done_callback(lambda _t: rec.error is not None and self.journal.discard(rid))
        return rec

    def _class(
        self, request: scheduler_pb2.SubmitRequest, spec: ServiceSpec, key: ApiKey | None, max_tokens: int
    ) -> RequestClass:
        """The request's priority (InvalidField ``priority`` when it is out of range or above what
        ``key`` allows) and key, as the capacity gate orders it."""
        asked = request.priority if request.HasField("priority") else None
        try:
            priority = request_priority(asked, spec.priority, key.max_priority if key is not None else None)
        except ValueError as e:
            who = f" (API key {key.name!r})" if key is not None else ""
            raise InvalidField("priority", f"{e}{who}") from None
        return RequestClass(priority, key.name if key is not None else "", max_tokens)

    def refuse(self, request_id: str, details: str, retry_after_s: int) -> None:
        """End a request held for capacity RESOURCE_EXHAUSTED (the capacity gate displaced or shed it)."""
        rec = self.journal.get(request_id)
        if rec is not None and not rec.done:
            asyncio.get_running_loop().create_task(
                rec.fail(grpc.StatusCode.RESOURCE_EXHAUSTED, details, retry_after_s)
            )

    def _complete(
        self, rid: str, spec: ServiceSpec, request: scheduler_pb2.SubmitRequest, raw: int
    ) -> RequestRecord:
        """A resume that holds every token of the request (its final chunk was lost in a failover): the
        record ends at once with FINISH_REASON_LENGTH; nothing is dispatched and its prompt's tokens are
        estimated (no engine counted them here)."""
        prefix = tuple(request.resume_token_ids)
        rec = RequestRecord(
            request_id=rid, service=spec.name, model=spec.model, fingerprint=_fingerprint(request),
            prefix_token_ids=prefix, n_tokens=len(prefix),
            prompt_tokens=self.prompt_tokens.estimate(spec.model, raw),
        )  # fmt: skip
        self.journal.add(rec)
        rec.driver = asyncio.create_task(rec.finish(rec.final_chunk(common_pb2.FINISH_REASON_LENGTH)))
        return rec

    def _rejected(self, service: str, reason: str) -> None:
        self.relay.metrics.rejected.labels(service, reason).inc()

    def _rate_limit(self, key: ApiKey, request: scheduler_pb2.SubmitRequest, raw: int) -> int:
        """Count a submission against ``key``'s rate limits (RESOURCE_EXHAUSTED with a retry-after past
        one); its tokens are the prompt estimate plus max_tokens. Returns the max_tokens counted."""
        assert key.limits is not None
        max_tokens = tokens = 0
        if key.limits.tokens_per_min is not None:
            spec = self.directory.services().get(request.service)
            if request.sampling.HasField("max_tokens"):
                max_tokens = request.sampling.max_tokens
            elif spec is not None:
                max_tokens = spec.max_tokens
            tokens = (self.prompt_tokens.estimate(spec.model, raw) if spec is not None else raw) + max_tokens
        share = self.key_shares.share(key.name, tokens) if self.key_shares is not None else (1.0, 1.0)
        try:
            self.key_limits.take(key.name, key.limits, tokens, share)
        except RateLimited as e:
            self._rejected(request.service, "rate_limited")
            self.relay.metrics.rate_limited.labels(key.name, e.limit).inc()
            raise RequestFailed(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e), e.retry_after_s) from None
        return max_tokens

    def _start_counted(
        self,
        rid: str,
        request: scheduler_pb2.SubmitRequest,
        deadline: float | None,
        key: ApiKey | None,
        max_tokens: int,
        raw: int,
    ) -> RequestRecord:
        """``_start`` for a request counted against ``key``'s tokens/min: gives back the part of
        ``max_tokens`` it did not generate when it ends (all of it when it is refused)."""
        assert key is not None
        try:
            rec = self._start(rid, request, deadline, key, raw)
        except (InvalidField, RequestFailed):
            self.key_limits.give_back(key.name, max_tokens)
            raise
        assert rec.driver is not None
        rec.driver.add_done_callback(
            lambda _t: self.key_limits.give_back(
                key.name, max_tokens - (rec.n_tokens - len(rec.prefix_token_ids))
            )
        )
        return rec

    async def _reap(self, rec: RequestRecord) -> None:
        """Cancel a request whose every listener left (client gone) unless one re-attaches in time."""
        await asyncio.sleep(self.orphan_grace_s)
        self._reapers.pop(rec.request_id, None)
        if rec.subscribers == 0 and not rec.done and rec.driver is not None:
            log.info("request %s: client gone for %.1fs, cancelling", rec.request_id, self.orphan_grace_s)
            rec.driver.cancel()

    def _cancel_reaper(self, rid: str) -> None:
        t = self._reapers.pop(rid, None)
        if t is not None:
            t.cancel()

    async def Cancel(self, request: common_pb2.CancelRequest, context: grpc.aio.ServicerContext):
        return common_pb2.CancelResponse(found=await self.cancel(request.request_id))

    async def cancel(self, request_id: str) -> bool:
        """Cancel a running request (the Cancel RPC; the HTTP API when its client disconnects)."""
        rec = self.journal.get(request_id)
        if rec is None or rec.done or rec.driver is None:
            return False
        rec.driver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await rec.driver
        return True

    async def ListServices(
        self, request: scheduler_pb2.ListServicesRequest, context: grpc.aio.ServicerContext
    ):
        engines = self.directory.engines().values()
        out = scheduler_pb2.ListServicesResponse()
        key = caller_key(current_security().key_store, context)
        for name, spec in sorted(self.directory.services().items()):
            if key is not None and not key.allows(name):
                continue
            out.services.add(
                name=name,
                model=spec.model,
                ttft_slo_s=spec.slo.ttft_s,
                tpot_slo_s=spec.slo.tpot_s,
                priority=spec.priority,
                engines=sorted(n.node_id for n in engines if spec.model in n.models),
            )
        return out

    async def close(self) -> None:
        for rec in self.journal.live():
            if rec.driver is not None:
                rec.driver.cancel()
        for t in self._reapers.values():
            t.cancel()


def _fingerprint(request: scheduler_pb2.SubmitRequest) -> bytes:
    r = scheduler_pb2.SubmitRequest()
    r.CopyFrom(request)
    r.request_id = ""
    r.ClearField("resume_token_ids")  # a resumed stream is the same request
    return r.SerializeToString(deterministic=True)
