"""The streaming helper every completion route shares.

``Run``: the requests of one HTTP call (``n`` choices, or several prompts) merged into one stream of
(choice, chunk) events; ``respond``: the whole JSON result, or server-sent events, in the shape of
the route's ``ResponseShape``. A client that leaves cancels the requests still running."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import grpc
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from llmfleet.api.v1 import common_pb2

from llmfleet_scheduler.http_api.backend import Backend
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


@dataclass
class Choice:
    index: int
    request_id: str
    chunks: AsyncIterator[common_pb2.TokenChunk]
    text: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    count_prompt: bool = True  # n>1 copies of a prompt count its tokens once


class Run:
    """The requests of one HTTP call, merged into one stream of (choice, chunk) events."""

    def __init__(self, backend: Backend, choices: list[Choice]) -> None:
        self.backend = backend
        self.choices = choices
        self.queue: asyncio.Queue[tuple[Choice, common_pb2.TokenChunk | BaseException | None]] = (
            asyncio.Queue()
        )
        self.tasks = [asyncio.create_task(self._pump(c)) for c in choices]
        self.open = len(choices)

    async def _pump(self, c: Choice) -> None:
        try:
            async for chunk in c.chunks:
                await self.queue.put((c, chunk))
            await self.queue.put((c, None))
        except Exception as e:  # RequestFailed
            await self.queue.put((c, e))

    async def events(self) -> AsyncIterator[tuple[Choice, common_pb2.TokenChunk]]:
        """(choice, chunk) until every choice finished; a failed choice raises."""
        while self.open:
            c, item = await self.queue.get()
            if item is None:
                self.open -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            if item.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                c.prompt_tokens = item.usage.prompt_tokens
                c.completion_tokens = item.usage.completion_tokens
                c.finish_reason = _FINISH.get(item.finish_reason, "stop")
                if item.finish_reason == common_pb2.FINISH_REASON_CANCELLED:
                    raise RequestFailed(grpc.StatusCode.CANCELLED, "request cancelled")
                if item.finish_reason == common_pb2.FINISH_REASON_ERROR:
                    raise RequestFailed(grpc.StatusCode.INTERNAL, "the engine failed the request")
            if item.text:
                c.text.append(item.text)
            yield c, item

    def usage(self) -> dict[str, int]:
        p = sum(c.prompt_tokens for c in self.choices if c.count_prompt)
        return usage_dict(p, sum(c.completion_tokens for c in self.choices))

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
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _until_disconnected(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def _drain(events: AsyncIterator[Any]) -> None:
    async for _ in events:
        pass


async def _replay(
    first: tuple[Choice, common_pb2.TokenChunk] | None,
    events: AsyncIterator[tuple[Choice, common_pb2.TokenChunk]],
) -> AsyncIterator[tuple[Choice, common_pb2.TokenChunk]]:
    """``first`` (None: the events had ended), then the rest of ``events``."""
    if first is None:
        return
    yield first
    async for event in events:
        yield event


async def _stream(
    run: Run,
    first: tuple[Choice, common_pb2.TokenChunk] | None,
    events: AsyncIterator[tuple[Choice, common_pb2.TokenChunk]],
    shape: ResponseShape,
    param: str,
) -> AsyncIterator[bytes]:
    """The server-sent events of a streamed response, from its ``first`` event on."""
    started: set[int] = set()
    try:
        async for c, chunk in _replay(first, events):
            new = c.index not in started
            started.add(c.index)
            if chunk.text or new:
                yield _sse(_piece(shape, c, chunk.text, new, False))
            if c.finish_reason is not None:
                yield _sse(_piece(shape, c, "", False, True))
        if shape.include_usage:
            out = shape.head(False)
            out["choices"] = []
            out["usage"] = run.usage()
            yield _sse(out)
        yield b"data: [DONE]\n\n"
    except Exception as e:  # a failure after the 200 went out: an error event, then the end
        yield _sse(from_exc(e, param).body())
        yield b"data: [DONE]\n\n"
    finally:  # also on client disconnect (the response task is cancelled)
        await run.close()


async def respond(request: Request, run: Run, stream: bool, param: str, shape: ResponseShape) -> Response:
    """The response to ``run``: the whole result, or (``stream``) server-sent events in ``shape``.
    ``param``: what the request calls its prompt (for error messages)."""
    events = run.events()
    # Wait for the whole result (or, streaming, the first event: an early failure such as no
    # engine or overload then gets its own status) while watching for the client leaving.
    watcher = asyncio.create_task(_until_disconnected(request))
    work = asyncio.ensure_future(_drain(events) if not stream else anext(events, None))
    try:
        await asyncio.wait({watcher, work}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not work.done():
        log.info("http client gone: cancelling %d request(s)", len(run.choices))
        work.cancel()
        await run.close()
        return JSONResponse(error_body("client disconnected", "cancelled"), status_code=499)
    exc = work.exception()
    if exc is not None or not stream:
        await run.close()
        return from_exc(exc, param).response() if exc is not None else JSONResponse(_final(shape, run))
    return StreamingResponse(
        _stream(run, work.result(), events, shape, param),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )
