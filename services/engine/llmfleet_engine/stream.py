"""``RequestStream``: the async iterator a consumer reads one request's chunks from.

Its source is an ``asyncio.Queue`` of finished chunks (the vLLM backend), or a :class:`ChunkSink`:
the native executor's lighter hand-off from the worker thread. The worker appends raw items to a
request's sink (a token id, or a chunk) and wakes the consumers with one ``call_soon_threadsafe`` per
event loop (:class:`LoopWaker`; a wake still pending absorbs the next ones; ``delivery.py`` decides
when: after every iteration, or once per stream interval); the consumer turns items into
``EngineChunk``s itself, detokenizing the token ids on the event loop when the worker did not need
their text (requests without stop strings). One chunk per token, as before: only the per-token
queue/future traffic and the worker's detokenization are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol, final

from llmfleet_engine.outputs import EngineChunk
from llmfleet_engine.text import TextStream


class _Canceller(Protocol):
    def cancel(self, request_id: str) -> bool: ...


@dataclasses.dataclass(frozen=True, slots=True)
class FinalText:
    """A final chunk whose text the consumer completes: its tokens' text, then (``flush``) the text
    the detokenizer still holds."""

    chunk: EngineChunk
    flush: bool


SinkItem = int | EngineChunk | FinalText


class LoopWaker:
    """Wakes waiting consumers on ``loop`` from any thread: one callback per burst of ``wake`` calls.
    Holds the loop weakly (the executor keeps one waker per loop it has seen)."""

    __slots__ = ("_lock", "_loop", "_pending", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._pending: list[ChunkSink] = []
        self._scheduled = False

    def wake(self, sinks: Iterable[ChunkSink]) -> None:
        """Have the consumers of ``sinks`` look at their items. ``RuntimeError`` if the loop is closed."""
        with self._lock:
            self._pending.extend(sinks)
            if self._scheduled:
                return  # the callback in flight will see these too
            self._scheduled = True
        loop = self._loop()
        try:
            if loop is None:
                raise RuntimeError("event loop is gone")
            loop.call_soon_threadsafe(self._run)
        except RuntimeError:
            with self._lock:
                self._scheduled = False
                self._pending.clear()
            raise

    def _run(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            self._scheduled = False
        for sink in pending:
            if sink.on_items is not None:  # a consumer that takes items by callback (no task wake)
                sink.on_items()
                continue
            waiter = sink.waiter
            if waiter is not None:
                sink.waiter = None
                if not waiter.done():
                    waiter.set_result(None)


@final
class ChunkSink:
    """One request's output between the worker thread and its consumer.

    ``items`` (appended by the worker, popped by the consumer; a deque is safe for that): a plain
    token id (text by ``text.push`` here, index counted from ``index``), a ready ``EngineChunk``, or a
    ``FinalText``. ``text`` is the request's detokenizer when the consumer detokenizes (None when the
    worker does, for stop strings).
    """

    __slots__ = ("index", "items", "on_items", "request_id", "text", "waiter", "waker")

    def __init__(self, request_id: str, waker: LoopWaker, text: TextStream | None, index: int) -> None:
        self.request_id = request_id
        self.waker = waker
        self.text = text
        self.index = index  # completion index of the next plain token id
        self.items: deque[SinkItem] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.on_items: Callable[[], None] | None = None  # set: called instead of waking ``waiter``

    def to_chunk(self, item: SinkItem) -> EngineChunk:
        """(consumer side) the chunk of one item."""
        if isinstance(item, EngineChunk):
            return item
        stream = self.text
        assert stream is not None, "token ids and FinalText come only when the consumer detokenizes"
        if type(item) is int:
            index = self.index
            self.index = index + 1
            return EngineChunk(self.request_id, index, (item,), stream.push(item)[0])
        assert isinstance(item, FinalText)
        text = "".join([stream.push(t)[0] for t in item.chunk.token_ids])
        if item.flush:
            text += stream.finish()
        return dataclasses.replace(item.chunk, text=text)


class RequestStream:
    """Async iterator over a request's ``EngineChunk``s; closing it (or cancelling the reader) cancels it."""

    def __init__(
        self, executor: _Canceller, request_id: str, queue: asyncio.Queue[EngineChunk] | ChunkSink
    ) -> None:
        self._executor = executor
        self._queue = queue
        self._done = False
        self.request_id = request_id

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> EngineChunk:
        if self._done:
            raise StopAsyncIteration
        source = self._queue
        try:
            if type(source) is ChunkSink:
                items = source.items
                while not items:
                    waiter = asyncio.get_running_loop().create_future()
                    source.waiter = waiter
                    try:
                        await waiter
                    finally:
                        source.waiter = None
                chunk = source.to_chunk(items.popleft())
            else:
                chunk = await source.get()
        except asyncio.CancelledError:
            self.close()
            raise
        if chunk.finish_reason is not None:
            self._done = True
        return chunk

    def close(self) -> None:
        """Cancel the request unless it already finished; further iteration stops."""
        if not self._done:
            self._done = True
            self._executor.cancel(self.request_id)

    async def aclose(self) -> None:
        self.close()

    async def run_into(self, take: Callable[[EngineChunk], None]) -> None:
        """Hand every chunk to ``take`` until the final one. From a ``ChunkSink`` this runs on the
        waker's callback, so a multiplexed stream wakes no task per token; an exception from ``take``
        ends the run with it. Cancelling the caller cancels the request (as closing does)."""
        source = self._queue
        if type(source) is not ChunkSink:
            async for chunk in self:
                take(chunk)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def drain() -> None:
            items = source.items
            while items and not done.done():
                try:
                    chunk = source.to_chunk(items.popleft())
                    if chunk.finish_reason is not None:
                        self._done = True
                    take(chunk)
                except BaseException as e:  # ends this stream, never the waker's other consumers
                    done.set_exception(e)
                    return
                if self._done:
                    done.set_result(None)

        source.on_items = drain
        try:
            drain()  # what is already there
            await done
        except asyncio.CancelledError:
            self.close()
            raise
        finally:
            source.on_items = None

    async def collect(self) -> list[EngineChunk]:
        """Read the stream to its final chunk."""
        return [chunk async for chunk in self]

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
