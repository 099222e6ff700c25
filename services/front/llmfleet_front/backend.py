"""``FrontBackend``: the OpenAI routes' ``Backend`` over the SDK's multiplexed path to the schedulers.

A request goes to a scheduler replica on its caller's ``SubmitMany`` call (``SchedulerLinks``: one call
per API key and replica), so the scheduler validates it, applies the key's limits and priority and runs
it exactly as an SDK request. Its chunks reach the HTTP response by callback on the call's reader (no
task wake per token). Failures come back as the status ``Submit`` would end with and become the
errors the in-scheduler API raises (``InvalidField`` for a bad field, naming it; ``RequestFailed``
otherwise), so the routes answer the same HTTP errors.

A replica that is unavailable (stopped, restarting) is left out and the request is resumed on the next
one, as the SDK does: with the same id and the tokens already relayed, deduplicated by
``StreamResumer``, so the client sees every token once. A client that leaves cancels the request on
its replica at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from llmfleet.api.v1 import common_pb2, scheduler_pb2
from llmfleet.client.resume import StreamResumer
from llmfleet.client.retry import pushback_s
from llmfleet.metrics.control import FrontMetrics
from llmfleet.rpc.mux import Emit
from llmfleet.spec.services import ServiceSpec
from llmfleet_scheduler.chat_template import ChatTemplates
from llmfleet_scheduler.http_api import Credentials, Follow
from llmfleet_scheduler.journal import RequestFailed
from llmfleet_scheduler.validation import InvalidField

from llmfleet_front.scheduler_links import SchedulerLinks

log = logging.getLogger(__name__)

UNSPECIFIED = common_pb2.FINISH_REASON_UNSPECIFIED
# SubmitRequest fields the scheduler's validation names first in its INVALID_ARGUMENT messages
_FIELDS = ("service", "prompt", "priority", "session", "request_id")


class Catalog(Protocol):
    """What the front knows of the cluster (``ClusterView``: etcd's services/, models/, nodes/)."""

    def ready(self) -> bool: ...

    def servable(self) -> tuple[bool, list[str]]: ...

    def services(self) -> dict[str, ServiceSpec]: ...

    def model_source(self, model: str) -> str | None: ...


@dataclass
class FrontBackend:
    """``links``: the calls to the schedulers; ``view``: the services and models (etcd); ``metrics``:
    where tokens relayed, upstream errors and resumes are counted.
    ``own_key``: the key sent for callers that send none (None: none). ``retries``: how often a request
    is moved to another replica after UNAVAILABLE (backoff ``backoff_s`` doubling to ``max_backoff_s``)."""

    links: SchedulerLinks
    view: Catalog
    metrics: FrontMetrics
    own_key: str | None = None
    retries: int = 3
    backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    templates: ChatTemplates | None = None  # default: model sources from etcd's models/
    # request id -> (replica, token) of the request's current attempt, until it ends
    _where: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.templates is None:
            self.templates = ChatTemplates(self.view.model_source)

    # -- Backend
    def ready(self) -> bool:
        return self.view.ready()

    def servable(self) -> tuple[bool, list[str]]:
        return self.view.servable()

    def services(self) -> dict[str, str]:
        return {name: spec.model for name, spec in self.view.services().items()}

    async def render_chat(self, model: str, messages: list[tuple[str, str]]) -> str:
        assert self.templates is not None
        return await self.templates.render(model, messages)

    def submit(self, request: scheduler_pb2.SubmitRequest, who: Credentials) -> tuple[str, Follow]:
        token = who.token or self.own_key
        rid = request.request_id

        async def follow(emit: Emit) -> None:
            await self._follow(request, token, emit)

        return rid, follow

    async def cancel(self, request_id: str) -> bool:
        where = self._where.pop(request_id, None)
        if where is None:
            return False
        address, token = where
        try:
            return await self.links.cancel(address, token, request_id)
        except grpc.aio.AioRpcError as e:  # the replica is gone: the request went with it
            log.info("cancel %s on %s: %s", request_id, address, e.code().name)
            return False

    # -- the request's attempts
    async def _follow(self, request: scheduler_pb2.SubmitRequest, token: str | None, emit: Emit) -> None:
        rid = request.request_id
        relay = _Relay(rid, emit, self.metrics.tokens_streamed.inc)
        failures = 0
        try:
            while True:
                address = self.links.pick()
                if address is None:
                    self.metrics.upstream_errors.labels(grpc.StatusCode.UNAVAILABLE.name).inc()
                    raise RequestFailed(grpc.StatusCode.UNAVAILABLE, "no scheduler is registered yet; retry")
                self._where[rid] = (address, token)
                try:
                    await self._attempt(address, token, _resumed(request, relay.token_ids), relay)
                    self._where.pop(rid, None)
                    return
                except grpc.aio.AioRpcError as e:
                    failures += 1
                    self.metrics.upstream_errors.labels(e.code().name).inc()
                    if e.code() != grpc.StatusCode.UNAVAILABLE or failures > self.retries:
                        raise as_request_error(e) from None
                    self.links.failed(address)
                    relay.retrying()
                    self.metrics.resumes.inc()
                    wait = min(self.max_backoff_s, self.backoff_s * 2 ** (failures - 1))
                    log.warning("request %s: scheduler %s unavailable (%s); retry %d/%d in %.2fs",
                                rid, address, e.details(), failures, self.retries, wait)  # fmt: skip
                    await asyncio.sleep(wait)
        except (RequestFailed, InvalidField):
            self._where.pop(rid, None)
            raise

    async def _attempt(
        self, address: str, token: str | None, request: scheduler_pb2.SubmitRequest, relay: _Relay
    ) -> None:
        stream = self.links.open(address, token, request, None)
        stream.on_chunk = relay.take
        try:
            async for final in stream:  # only the final chunk: the others went to relay.take
                relay.take(final)
        finally:
            stream.cancel()  # a no-op once it ended; else (cancelled) the scheduler stops streaming it


@dataclass
class _Relay:
    """Hands a request's chunks on, each token once across attempts; the tokens so far are what a retry
    resumes from. The first attempt passes chunks through as they come; from the first retry on, a
    ``StreamResumer`` (fed what was relayed) drops what the next replica replays."""

    request_id: str
    emit: Callable[[common_pb2.TokenChunk], None]
    count: Callable[[int], None]  # hears how many tokens each relayed chunk carries (the front's metrics)
    token_ids: list[int] = field(default_factory=list)
    text_len: int = 0  # characters relayed
    resumer: StreamResumer | None = None

    def retrying(self) -> None:
        """Before the next attempt: what it replays is checked against what was relayed."""
        if self.resumer is None:
            self.resumer = StreamResumer(request_id=self.request_id)
            if self.token_ids or self.text_len:  # only the positions count, not the text itself
                self.resumer.accept(common_pb2.TokenChunk(token_ids=self.token_ids, text=" " * self.text_len))
        self.resumer.begin_attempt()

    def take(self, msg: common_pb2.TokenChunk) -> None:
        if self.resumer is None:
            self.token_ids.extend(msg.token_ids)
            self.text_len += len(msg.text)
            if msg.token_ids:
                self.count(len(msg.token_ids))
            self.emit(msg)
            return
        final = msg.finish_reason != UNSPECIFIED
        fresh = self.resumer.accept(msg)
        if fresh is None:
            if final:  # its usage and finish reason, without the text already relayed
                out = common_pb2.TokenChunk()
                out.CopyFrom(msg)
                out.ClearField("token_ids")
                out.text = ""
                self.emit(out)
            return
        self.token_ids.extend(fresh.token_ids)
        self.text_len += len(fresh.text)
        if fresh.token_ids:
            self.count(len(fresh.token_ids))
        if fresh.index != msg.index or fresh.text != msg.text:  # part of it was relayed before
            out = common_pb2.TokenChunk()
            out.CopyFrom(msg)
            out.index = fresh.index
            del out.token_ids[:]
            out.token_ids.extend(fresh.token_ids)
            out.text = fresh.text
            msg = out
        self.emit(msg)


def _resumed(request: scheduler_pb2.SubmitRequest, token_ids: list[int]) -> scheduler_pb2.SubmitRequest:
    """``request``, carrying the tokens already relayed (a replica that does not know it continues
    from them)."""
    if not token_ids:
        return request
    out = scheduler_pb2.SubmitRequest()
    out.CopyFrom(request)
    out.resume_token_ids.extend(token_ids)
    return out


def as_request_error(e: grpc.aio.AioRpcError) -> Exception:
    """The scheduler's status as the in-scheduler API's exception: ``InvalidField`` when it names a
    request field (``field: message``), else ``RequestFailed`` with its retry pushback."""
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        name, sep, message = details.partition(": ")
        if sep and (name in _FIELDS or name.startswith("sampling.")):
            return InvalidField(name, message)
    pushback = pushback_s(e)
    retry_after = max(1, round(pushback)) if pushback is not None else None
    return RequestFailed(code, details, retry_after)
