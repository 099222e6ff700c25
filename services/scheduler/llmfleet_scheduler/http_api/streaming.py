"""The response path every completion route shares.

``Run``: the requests of one HTTP call (``n`` choices, or several prompts). Each choice's chunks reach
it through a callback as the journal gets them (no task wake per token); streamed, they become
server-sent events at once, and one writer sends whatever is pending in one write. ``respond``: the
whole JSON result, or the event stream, in the shape of the route's ``ResponseShape``. A client that
leaves cancels the requests still running."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import grpc
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from llmfleet.api.v1 import common_pb2
from starlette.types import Receive, Scope, Send

from llmfleet_scheduler.http_api.backend import Backend, Follow
from llmfleet_scheduler.http_api.errors import from_exc
from llmfleet_scheduler.journal import RequestFailed
from llmfleet_scheduler.openai_protocol import error_body, now, usage_dict

log = logging.getLogger(__name__)

_FINISH = {
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_EOS: "stop",
}
_BACKGROUND: set[asyncio.Future] = set()
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # built once: json.dumps with options is not
DONE = b"data: [DONE]\n\n"
_MARK = "\x00llmfleet-text\x00"  # stands for a piece's text in its template


@dataclass
class Choice:
    index: int
    request_id: str
    follow: Follow
    text: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens its engine found in its prefix cache
    finish_reason: str | None = None
    count_prompt: bool = True  # n>1 copies of a prompt count its tokens once
    started: bool = False  # its first piece is out
    # its text pieces' event around the JSON string of the text (built at its second piece)
    template: tuple[bytes, bytes] | None = None


class Run:
    """The requests of one HTTP call. ``shape`` and ``stream``: their chunks become ``shape``'s events
    as they arrive; else only the whole result is kept."""

    def __init__(self, backend: Backend, choices: list[Choice], shape: ResponseShape, stream: bool) -> None:
        self.backend = backend
        self.choices = choices
        self.shape = shape
        self.stream = stream
        self.frames: list[bytes] = []  # events not yet written
        self.error: BaseException | None = None  # the first choice that failed
        self.open = len(choices)
        self.gone = False  # the client left
        self._wake: asyncio.Future[None] | None = None
        self.tasks = [asyncio.create_task(self._follow(c)) for c in choices]

    @property
    def ended(self) -> bool:
        return self.open == 0 or self.error is not None or self.gone

    async def _follow(self, c: Choice) -> None:
        try:
            await c.follow(functools.partial(self._take, c))
        except Exception as e:  # RequestFailed
            self._failed(e)
        finally:
            self.open -= 1
            self._signal()

    def _take(self, c: Choice, chunk: common_pb2.TokenChunk) -> None:
        if chunk.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
            c.prompt_tokens = chunk.usage.prompt_tokens
            c.completion_tokens = chunk.usage.completion_tokens
            c.cached_tokens = chunk.usage.cached_tokens
            c.finish_reason = _FINISH.get(chunk.finish_reason, "stop")
            if chunk.finish_reason == common_pb2.FINISH_REASON_CANCELLED:
                self._failed(RequestFailed(grpc.StatusCode.CANCELLED, "request cancelled"))
                return
            if chunk.finish_reason == common_pb2.FINISH_REASON_ERROR:
                self._failed(RequestFailed(grpc.StatusCode.INTERNAL, "the engine failed the request"))
                return
        if chunk.text:
            c.text.append(chunk.text)
        if self.stream and self.error is None:
            new = not c.started
            c.started = True
            if new:
                self.frames.append(_sse(_piece(self.shape, c, chunk.text, True, False)))
            elif chunk.text:
                self.frames.append(self._text_event(c, chunk.text))
            if c.finish_reason is not None:
                self.frames.append(_sse(_piece(self.shape, c, "", False, True)))
            self._signal()

    def _text_event(self, c: Choice, text: str) -> bytes:
        """``_sse(_piece(shape, c, text, False, False))`` without encoding the whole event per token:
        only ``text`` changes from one piece of a choice to the next."""
        if c.template is None:
            whole = _ENCODE(_piece(self.shape, c, _MARK, False, False))
            head, _, tail = whole.partition(_ENCODE(_MARK))
            c.template = (b"data: " + head.encode(), tail.encode() + b"\n\n")
        head_b, tail_b = c.template
        return head_b + _ENCODE(text).encode() + tail_b

    def _failed(self, e: BaseException) -> None:
        if self.error is None:
            self.error = e
        self._signal()

    def leave(self) -> None:
        """The client left."""
        self.gone = True
        self._signal()

    def _signal(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def wait(self, for_frames: bool) -> None:
        """Until the run ended, or (``for_frames``) events are pending."""
        while not self.ended and not (for_frames and self.frames):
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake

    def take(self) -> bytes:
        """The pending events, as one write."""
        data = b"".join(self.frames)
        self.frames.clear()
        return data

    def usage(self) -> dict[str, Any]:
        counted = [c for c in self.choices if c.count_prompt]
        return usage_dict(
            sum(c.prompt_tokens for c in counted),
            sum(c.completion_tokens for c in self.choices),
            sum(c.cached_tokens for c in counted),
        )

    async def close(self) -> None:
        """Stop listening; requests still running are cancelled (client gone, or a sibling failed)."""
        for t in self.tasks:
            t.cancel()
        pending = [c.request_id for c in self.choices if c.finish_reason is None]
        if pending:  # in a task: the response being cancelled (client gone) must not stop the cancel
            task = asyncio.ensure_future(self._cancel(pending))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)
            await asyncio.shield(task)

    async def _cancel(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            try:
                await self.backend.cancel(rid)
            except Exception:
                log.exception("cancelling %s", rid)


@dataclass
class ResponseShape:
    """What one route's responses look like (a subclass per route); ``respond`` wraps the parts in
    the common envelope. ``id``: ``{id_prefix}-<uuid>`` unless given."""

    id_prefix: ClassVar[str] = "resp"
    model: str  # as the request named it
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    id: str = ""
    created: int = field(default_factory=now)

    def __post_init__(self) -> None:
        self.id = self.id or f"{self.id_prefix}-{uuid.uuid4().hex}"

    def head(self, final: bool) -> dict[str, Any]:
        """The fields every chunk (``final``: the whole non-streamed response) starts with."""
        raise NotImplementedError

    def piece_content(self, text: str, new: bool, closing: bool) -> dict[str, Any]:
        """A streamed choice's content: ``new`` (its first chunk), ``closing`` (the empty last one)."""
        raise NotImplementedError

    def final_content(self, text: str) -> dict[str, Any]:
        """A choice's content in the whole response."""
        raise NotImplementedError


def _choice(c: Choice, content: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    return {"index": c.index, **content, "logprobs": None, "finish_reason": finish_reason}


def _piece(shape: ResponseShape, c: Choice, text: str, new: bool, closing: bool) -> dict[str, Any]:
    # the finish reason rides on an empty closing chunk, so text chunks carry null
    out = shape.head(False)
    out["choices"] = [
        _choice(c, shape.piece_content(text, new, closing), c.finish_reason if closing else None)
    ]
    if shape.include_usage:
        out["usage"] = None
    return out


def _final(shape: ResponseShape, run: Run) -> dict[str, Any]:
    out = shape.head(True)
    out["choices"] = [_choice(c, shape.final_content("".join(c.text)), c.finish_reason) for c in run.choices]
    out["usage"] = run.usage()
    return out


def _sse(obj: Any) -> bytes:
    return b"data: " + _ENCODE(obj).encode() + b"\n\n"


async def _until_disconnected(receive: Receive, run: Run) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            run.leave()
            return


class EventStream(Response):
    """A run's server-sent events: each write carries every event pending when the writer wakes; the
    last one ends the stream (after the usage event, or an error event for a failure after the 200)."""

    media_type = "text/event-stream"

    def __init__(self, run: Run, watcher: asyncio.Task, param: str) -> None:
        # no Content-Length: the body is sent in chunks as it comes
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
        ]
        self.run = run
        self.watcher = watcher  # the client leaving ends the run
        self.param = param

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        run = self.run
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            while True:
                await run.wait(for_frames=True)
                if run.gone:
                    log.info("http client gone: cancelling %d request(s)", len(run.choices))
                    return
                if not run.ended:
                    await send({"type": "http.response.body", "body": run.take(), "more_body": True})
                    continue
                await send(
                    {"type": "http.response.body", "body": run.take() + self._tail(), "more_body": False}
                )
                return
        finally:  # also when the response task is cancelled
            self.watcher.cancel()
            await run.close()

    def _tail(self) -> bytes:
        run = self.run
        if run.error is not None:  # a failure after the 200 went out: an error event, then the end
            return _sse(from_exc(run.error, self.param).body()) + DONE
        if not run.shape.include_usage:
            return DONE
        out = run.shape.head(False)
        out["choices"] = []
        out["usage"] = run.usage()
        return _sse(out) + DONE


async def respond(
    request: Request, backend: Backend, choices: list[Choice], stream: bool, param: str, shape: ResponseShape
) -> Response:
    """The response to ``choices``: the whole result, or (``stream``) server-sent events in ``shape``.
    ``param``: what the request calls its prompt (for error messages)."""
    run = Run(backend, choices, shape, stream)
    # Wait for the whole result (or, streaming, the first event: an early failure such as no engine or
    # overload then gets its own status) while watching for the client leaving.
    watcher = asyncio.create_task(_until_disconnected(request.receive, run))
    try:
        await run.wait(for_frames=stream)
    except BaseException:
        watcher.cancel()
        await run.close()
        raise
    if run.gone:
        log.info("http client gone: cancelling %d request(s)", len(run.choices))
        await run.close()
        return JSONResponse(error_body("client disconnected", "cancelled"), status_code=499)
    if run.error is not None and not (stream and run.frames):
        watcher.cancel()
        await run.close()
        return from_exc(run.error, param).response()
    if not stream:
        watcher.cancel()
        await run.close()
        return JSONResponse(_final(shape, run))
    return EventStream(run, watcher, param)
