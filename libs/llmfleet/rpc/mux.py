"""Multiplexed token streams: many requests' streams on one gRPC call.

A per-request server-streaming call costs a call set-up and one message per token on each side; in
grpc's asyncio stack that is about 0.1 ms of CPU per message and more per call. ``SubmitMany``
(SDK → scheduler) and ``GenerateMany`` (scheduler → engine) carry every request of a client on one
bidirectional call instead: the caller sends ``*Commands`` (requests to start, streams to stop), the
server answers with :class:`ChunkBatch` es holding the chunks of all of them.

There is no timer: the server's writer sends what is ready as soon as its previous write is done, so
an idle path sends each chunk at once and a busy one gathers the chunks that became ready meanwhile
(one engine step's tokens for all its requests, typically) into one message.

* :class:`MuxLink` (caller side) opens the call lazily, hands out :class:`MuxStream` s that read like
  a ``grpc.aio`` unary-stream call (async iteration, ``cancel()``, ``done()``; errors are
  ``grpc.aio.AioRpcError`` with the status a per-request call would end with, including the retry
  pushback trailer), and fails every open stream with the call's status when the call breaks; the next
  ``open`` starts a fresh call.
* :func:`serve_many` (server side) runs one handler per started request (it hands its chunks to an
  ``emit`` callback, or :func:`from_iterator` adapts an async iterator; :class:`StreamRefused` ends
  it with a status) and batches their output.

Both ends can relay without waking a task per token: a :class:`MuxStream` with ``on_chunk`` set hands
chunks to the callback on the link's reader, and a handler may call ``emit`` from any callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import grpc
from opentelemetry.trace import Span

from llmfleet.api.v1 import common_pb2, engine_pb2, scheduler_pb2
from llmfleet.telemetry.streams import client_span, end_span, server_span

log = logging.getLogger(__name__)

# the multiplexed methods' full names (their streams' span names)
GENERATE_MANY = f"/{engine_pb2.DESCRIPTOR.services_by_name['Engine'].full_name}/GenerateMany"
SUBMIT_MANY = f"/{scheduler_pb2.DESCRIPTOR.services_by_name['Scheduler'].full_name}/SubmitMany"

UNSPECIFIED = common_pb2.FINISH_REASON_UNSPECIFIED
PUSHBACK = "grpc-retry-pushback-ms"
_CODES = {c.value[0]: c for c in grpc.StatusCode}
CALL_FINAL = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)


class StreamRefused(Exception):
    """Ends one multiplexed stream with a status (a per-request call would have been aborted so)."""

    def __init__(self, code: grpc.StatusCode, details: str, retry_after_s: float | None = None) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.retry_after_s = retry_after_s


def rpc_error(code: grpc.StatusCode, details: str, retry_after_s: float = 0.0) -> grpc.aio.AioRpcError:
    """The ``AioRpcError`` a per-request call ending with this status raises (pushback in trailers)."""
    trailing = grpc.aio.Metadata()
    if retry_after_s > 0:
        trailing.add(PUSHBACK, str(int(retry_after_s * 1000)))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details)


def status_code(value: int) -> grpc.StatusCode:
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


class MuxStream:
    """One request's chunks on a :class:`MuxLink`: iterate it like a unary-stream call's response."""

    __slots__ = (
        "_error", "_finished", "_items", "_link", "_span", "_timer", "_waiter", "on_chunk", "request_id",
    )  # fmt: skip

    def __init__(self, link: MuxLink, request_id: str) -> None:
        self._link = link
        self.request_id = request_id
        self._items: deque[common_pb2.TokenChunk] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._finished = False  # the final chunk arrived
        self._timer: asyncio.TimerHandle | None = None
        self._span: Span | None = None  # the stream's client span while tracing is on
        # set: chunks before the final one go to this callback as they arrive (on the link's reader,
        # no wake-up of the consumer per chunk); iteration then yields only the final chunk
        self.on_chunk: Callable[[common_pb2.TokenChunk], None] | None = None

    # -- the link's side
    def _push(self, chunk: common_pb2.TokenChunk) -> None:
        if chunk.finish_reason != UNSPECIFIED:
            self._finished = True
            self._end()
        elif self.on_chunk is not None:
            try:
                self.on_chunk(chunk)
            except Exception as e:  # the consumer's bug ends its stream, never the link
                log.exception("stream %s: chunk callback failed", self.request_id)
                self._fail(rpc_error(grpc.StatusCode.INTERNAL, f"relaying a chunk failed: {e!r}"))
                self._link._stop(self.request_id, self)
            return
        self._items.append(chunk)
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None and not self._finished:
            self._error = error
            self._end()
            self._wake()

    def _end(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._span is not None:
            end_span(self._span, self._error)
            self._span = None

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def _expire(self) -> None:
        self._timer = None
        if not self.done():
            self._fail(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
            self._link._stop(self.request_id, self)

    # -- the consumer's side
    def __aiter__(self) -> MuxStream:
        return self

    async def __anext__(self) -> common_pb2.TokenChunk:
        items = self._items
        while not items:
            if self._error is not None:
                raise self._error
            if self._finished:
                raise StopAsyncIteration
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            await waiter
        return items.popleft()

    def done(self) -> bool:
        return self._finished or self._error is not None

    def cancel(self) -> bool:
        """Stop the stream (the server cancels it as a cancelled call); a reader gets CancelledError."""
        if self.done():
            return False
        self._fail(asyncio.CancelledError())
        self._link._stop(self.request_id, self)
        return True


class _Call(Protocol):
    async def write(self, request: Any) -> None: ...

    def cancel(self) -> bool: ...

    def __aiter__(self) -> AsyncIterator[common_pb2.ChunkBatch]: ...


class MuxLink:
    """The caller's end of one multiplexed call. ``open_call()`` starts the call (e.g.
    ``stub.GenerateMany``); ``commands`` is its request message type (``GenerateCommands`` or
    ``SubmitCommands``: ``start`` entries with ``request``, ``timeout_s`` and ``trace_context``, and
    ``cancel`` ids); ``method`` is the call's full method name, each stream's span name.

    The call serves every request of the link, so it is opened outside any request's context: its
    own span (tracing's gRPC interceptor) belongs to no request's trace, while each stream has its own
    client span in the trace of the request that opened it (:mod:`llmfleet.telemetry.streams`).

    ``on_call`` (optional) hears of the call: True when one opens, False when it ends."""

    def __init__(
        self,
        open_call: Callable[[], _Call],
        commands: type,
        method: str,
        name: str = "",
        on_call: Callable[[bool], None] | None = None,
    ) -> None:
        self._open_call = open_call
        self._on_call = on_call
        self._commands = commands
        self.method = method
        self.name = name
        self.streams: dict[str, MuxStream] = {}
        self._call: _Call | None = None
        self._tasks: list[asyncio.Task] = []
        self._pending = commands()  # the next message to write: starts (copied at open) and cancels
        self._has_pending = False
        self._kick: asyncio.Future[None] | None = None
        self._closed = False
        self.calls_opened = 0

    def open(self, request_id: str, request: Any, timeout_s: float | None = None) -> MuxStream:
        """Start ``request`` (id ``request_id``) on the call; returns its stream at once."""
        stream = MuxStream(self, request_id)
        if self._closed:
            stream._fail(rpc_error(grpc.StatusCode.CANCELLED, f"link {self.name} is closed"))
            return stream
        if request_id in self.streams:
            stream._fail(
                rpc_error(
                    grpc.StatusCode.ALREADY_EXISTS, f"request {request_id!r} is already open on this call"
                )
            )
            return stream
        self.streams[request_id] = stream
        if timeout_s is not None:
            stream._timer = asyncio.get_running_loop().call_later(max(timeout_s, 0.0), stream._expire)
        stream._span, carrier = client_span(self.method, request_id)
        self._pending.start.add(request=request, timeout_s=timeout_s or 0.0, trace_context=carrier)
        self._has_pending = True
        self._ensure_call()
        self._wake_writer()
        return stream

    async def close(self) -> None:
        self._closed = True
        self._reset(rpc_error(grpc.StatusCode.CANCELLED, f"link {self.name} closed"))

    # -- internals
    def _stop(self, request_id: str, stream: MuxStream) -> None:
        if self.streams.get(request_id) is stream:
            del self.streams[request_id]
            if self._call is not None:
                self._pending.cancel.append(request_id)
                self._has_pending = True
                self._wake_writer()

    def _wake_writer(self) -> None:
        k = self._kick
        if k is not None:
            self._kick = None
            if not k.done():
                k.set_result(None)

    def _ensure_call(self) -> None:
        if self._call is not None:
            return
        detached = contextvars.Context()  # no request's span is current in the call or its tasks
        call = self._call = detached.run(self._open_call)
        self.calls_opened += 1
        if self._on_call is not None:
            self._on_call(True)
        self._tasks = [
            asyncio.create_task(self._write(call), name=f"mux-write-{self.name}", context=detached),
            asyncio.create_task(self._read(call), name=f"mux-read-{self.name}", context=detached),
        ]

    async def _write(self, call: _Call) -> None:
        try:
            while self._call is call:
                if not self._has_pending:
                    kick = asyncio.get_running_loop().create_future()
                    self._kick = kick
                    await kick
                    continue
                msg, self._pending, self._has_pending = self._pending, self._commands(), False
                await call.write(msg)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the call broke: the reader sees why and fails the streams
            log.debug("mux %s: write failed: %r", self.name, e)

    async def _read(self, call: _Call) -> None:
        error: BaseException
        try:
            streams = self.streams
            async for batch in call:
                for chunk in batch.chunks:
                    s = streams.get(chunk.request_id)
                    if s is not None:
                        if chunk.finish_reason != UNSPECIFIED:
                            del streams[chunk.request_id]
                        s._push(chunk)
                for end in batch.errors:
                    s = streams.pop(end.request_id, None)
                    if s is not None:
                        s._fail(rpc_error(status_code(end.code), end.details, end.retry_after_s))
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.name}: the multiplexed call ended")
        except asyncio.CancelledError:
            return
        except grpc.aio.AioRpcError as e:
            # the call's own status is final only when it is about the call (credentials, an
            # unknown method); anything else (a broken connection, a cancel by grpc's core) is a
            # path that went away: UNAVAILABLE, which callers fail over or resume from
            code = e.code() if e.code() in CALL_FINAL else grpc.StatusCode.UNAVAILABLE
            error = rpc_error(code, f"{self.name}: {e.code().name}: {e.details()}")
        except Exception as e:
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.name}: multiplexed call failed: {e!r}")
        if self._call is call:
            self._reset(error, own=asyncio.current_task())

    def _reset(self, error: BaseException, own: asyncio.Task | None = None) -> None:
        """The call is over: fail its streams with ``error``; the next ``open`` starts a new call."""
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
            if self._on_call is not None:
                self._on_call(False)
        for t in self._tasks:
            if t is not own:
                t.cancel()
        self._tasks = []
        self._pending, self._has_pending = self._commands(), False
        streams, self.streams = self.streams, {}
        for s in streams.values():
            s._fail(error)
        self._wake_writer()


Emit = Callable[[common_pb2.TokenChunk], None]
# Runs one stream: hands its chunks to ``emit`` (in order, the final one last) and returns when done;
# ``StreamRefused`` ends it with a status. Called as ``handler(request, timeout_s, emit)``.
Handler = Callable[[Any, float | None, Emit], Awaitable[None]]


def from_iterator(chunks: Callable[[Any, float | None], AsyncIterator[common_pb2.TokenChunk]]) -> Handler:
    """A :data:`Handler` from a function returning a request's chunks as an async iterator."""

    async def run(request: Any, timeout_s: float | None, emit: Emit) -> None:
        async for chunk in chunks(request, timeout_s):
            emit(chunk)

    return run


class _StreamContext:
    """What a per-request servicer method needs of its context, for one stream of a multiplexed call:
    ``abort`` ends the stream (not the call) with that status and retry pushback."""

    async def abort(self, code: grpc.StatusCode, details: str, trailing: tuple = ()) -> None:
        pushback = dict(trailing).get(PUSHBACK)
        raise StreamRefused(code, details, int(pushback) / 1000 if pushback else None)


def from_servicer(method: Callable[[Any, Any], AsyncIterator[common_pb2.TokenChunk]]) -> Handler:
    """A :data:`Handler` from a unary-stream servicer method (``method(request, context)``, e.g. a
    test double's ``Generate``): its ``context.abort`` ends the stream with that status."""
    return from_iterator(lambda request, _timeout: method(request, _StreamContext()))


class _ServerCall:
    """The server's state of one multiplexed call: a pump task per started stream, and the chunks
    and stream ends waiting to go out in the next batch."""

    def __init__(self, handler: Handler, name: str, method: str) -> None:
        self.loop = asyncio.get_running_loop()
        self.handler = handler
        self.name = name
        self.method = method
        self.chunks: list[common_pb2.TokenChunk] = []
        self.errors: list[common_pb2.StreamEnd] = []
        self.pumps: dict[str, asyncio.Task] = {}
        self.kick: asyncio.Future[None] | None = None  # set while the writer waits for output
        self.reading = True

    def wake(self) -> None:
        k = self.kick
        if k is not None:
            self.kick = None
            if not k.done():
                k.set_result(None)

    def emit(self, chunk: common_pb2.TokenChunk) -> None:
        self.chunks.append(chunk)
        if self.kick is not None:
            self.wake()

    def refuse(
        self, rid: str, code: grpc.StatusCode, details: str, retry_after_s: float | None = None
    ) -> None:
        self.errors.append(
            common_pb2.StreamEnd(
                request_id=rid, code=code.value[0], details=details, retry_after_s=retry_after_s or 0.0
            )
        )
        self.wake()

    async def pump(self, rid: str, request: Any, timeout_s: float, carrier: Mapping[str, str]) -> None:
        """Run the handler of one stream (in its server span when the caller sent a trace context);
        how it ends becomes that stream's end."""
        try:
            with server_span(self.method, rid, carrier):
                if timeout_s > 0:
                    async with asyncio.timeout(timeout_s):
                        await self.handler(request, timeout_s, self.emit)
                else:
                    await self.handler(request, None, self.emit)
        except StreamRefused as e:
            self.refuse(rid, e.code, e.details, e.retry_after_s)
        except TimeoutError:
            self.refuse(rid, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except asyncio.CancelledError:
            pass  # stopped by the caller (cancel, or the call ended)
        except Exception as e:
            log.exception("%s: stream %s failed", self.name, rid)
            self.refuse(rid, grpc.StatusCode.INTERNAL, f"{self.name}: {e}")
        finally:
            if self.pumps.get(rid) is asyncio.current_task():
                del self.pumps[rid]
            self.wake()

    def start(self, rid: str, request: Any, timeout_s: float, carrier: Mapping[str, str]) -> None:
        if not rid:  # its chunks could not be told from another stream's
            self.refuse(rid, grpc.StatusCode.INVALID_ARGUMENT, "start.request.request_id: must not be empty")
        elif rid in self.pumps:
            self.refuse(rid, grpc.StatusCode.ALREADY_EXISTS, f"request {rid!r} is already open on this call")
        else:
            self.pumps[rid] = self.loop.create_task(self.pump(rid, request, timeout_s, carrier))

    async def read(self, commands: AsyncIterator[Any]) -> None:
        """Start and cancel streams as the caller's commands say, until it stops sending."""
        try:
            async for msg in commands:
                # starts first: a stream stopped before its start was written comes in one message
                for start in msg.start:
                    self.start(start.request.request_id, start.request, start.timeout_s, start.trace_context)
                for rid in msg.cancel:
                    task = self.pumps.pop(rid, None)
                    if task is not None:
                        task.cancel()
        finally:
            self.reading = False
            self.wake()


async def serve_many(
    commands: AsyncIterator[Any], handler: Handler, *, method: str, name: str = "mux"
) -> AsyncIterator[common_pb2.ChunkBatch]:
    """The server's end of a multiplexed call (``method``: its full name, each stream's span name):
    for every ``start`` in ``commands`` run ``handler(request, timeout_s, emit)`` (what it emits goes
    out in batches; ``StreamRefused`` ends the stream with a status; past ``timeout_s``
    DEADLINE_EXCEEDED); a ``cancel`` stops the handler as a cancelled call would. Ends when the caller
    has stopped sending and every handler is done; the caller going away cancels them all."""
    call = _ServerCall(handler, name, method)
    reader = call.loop.create_task(call.read(commands), name=f"{name}-commands")
    try:
        while True:
            if call.chunks or call.errors:
                batch = common_pb2.ChunkBatch(chunks=call.chunks, errors=call.errors)
                call.chunks.clear()
                call.errors.clear()
                yield batch
                continue
            if not call.reading and not call.pumps:
                return
            k = call.loop.create_future()
            call.kick = k
            await k
    finally:
        reader.cancel()
        for task in list(call.pumps.values()):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
