"""Helpers for tests of code built on llmfleet (polling with a deadline instead of sleep-and-hope)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float, what: str) -> None:
    """Poll ``check`` (sync or async) every 50 ms until it is true; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        ok = check()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        await asyncio.sleep(0.05)


class StaticView(Generic[T]):
    """A ready, never-changing stand-in for ``llmfleet.coord.PrefixView`` (its ``snapshot``, ``ready``
    and ``stop``), for tests that hand a ``ClusterDirectory`` fixed services or nodes."""

    def __init__(self, items: dict[str, T]) -> None:
        self.items = items
        self.ready = asyncio.Event()
        self.ready.set()

    def snapshot(self) -> dict[str, T]:
        return dict(self.items)

    async def subscribe(self) -> AsyncIterator[tuple[int, dict[str, T]]]:
        """The items once (a test that changes them tells the reader itself)."""
        yield 0, self.snapshot()

    async def stop(self) -> None:
        pass
