"""``RequestStream``: the async iterator a consumer reads one request's chunks from."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from llmfleet_engine.outputs import EngineChunk


class _Canceller(Protocol):
    def cancel(self, request_id: str) -> bool: ...


class RequestStream:
    """Async iterator over a request's ``EngineChunk``s; closing it (or cancelling the reader) cancels it."""

    def __init__(self, executor: _Canceller, request_id: str, queue: asyncio.Queue[EngineChunk]) -> None:
        self._executor = executor
        self._queue = queue
        self._done = False
        self.request_id = request_id

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> EngineChunk:
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

    async def collect(self) -> list[EngineChunk]:
        """Read the stream to its final chunk."""
        return [chunk async for chunk in self]

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
