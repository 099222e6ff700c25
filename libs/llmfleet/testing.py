"""Helpers for tests of code built on llmfleet (polling with a deadline instead of sleep-and-hope)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


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
