"""PrefixView: an in-memory, always-consistent mirror of one etcd prefix (list at R, then watch from R+1)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from llmfleet.coord.client import EtcdClient, WatchEvent

log = logging.getLogger(__name__)

T = TypeVar("T")


class PrefixView(Generic[T]):
    """Map of key leaf (text after ``prefix``) -> decoded value, consistent with one etcd revision.

    A background task lists the prefix at revision R, then applies each later revision's events
    atomically. On any watch error (compaction, etcd restart, network) it re-lists and resumes; it never
    raises. Values that fail to decode are logged and left out.
    """

    def __init__(self, client: EtcdClient, prefix: str, decode: Callable[[bytes], T]) -> None:
        self.client = client
        self.prefix = prefix
        self.decode = decode
        self.ready = asyncio.Event()
        self.relists = 0  # lists after the first (watch restarts)
        self._raw: dict[str, bytes] = {}
        self._data: dict[str, T] = {}
        self._revision = 0
        self._version = 0  # bumps on every visible change
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def revision(self) -> int:
        """The etcd revision the current snapshot corresponds to (0 before ready)."""
        return self._revision

    def snapshot(self) -> dict[str, T]:
        """A copy of the current map (leaf -> value)."""
        return dict(self._data)

    @property
    def running(self) -> bool:
        """The background task is alive: started, not stopped, never crashed."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Start mirroring in the background and return at once (see ``ready``)."""
        self._stopped = False
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"view:{self.prefix}")

    async def stop(self) -> None:
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            # cancel until it ends: a cancellation that lands inside an etcd call the client treats
            # as its channel's (and retries) must not leave stop() waiting forever
            for _ in range(10):
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=1.0)
                if done:
                    break
            else:
                log.warning("view %s: the watch task did not stop", self.prefix)
            if task.done() and not task.cancelled():
                with contextlib.suppress(Exception):
                    task.exception()
        self._notify()  # wake subscribers so they can end

    async def wait_for(self, predicate: Callable[[dict[str, T]], bool], timeout: float) -> dict[str, T]:
        """Wait until ``predicate(snapshot)`` holds and return that snapshot; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            changed = self._changed
            if self.ready.is_set():
                snap = self.snapshot()
                if predicate(snap):
                    return snap
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"PrefixView {self.prefix!r}: condition not met within {timeout}s "
                    f"(ready={self.ready.is_set()}, revision={self._revision}, keys={sorted(self._data)[:20]})"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)

    async def subscribe(self) -> AsyncIterator[tuple[int, dict[str, T]]]:
        """Yield (revision, snapshot) once when ready and then after every change, until stop().

        A slow consumer skips intermediate states and always gets the latest one."""
        seen = -1
        while not self._stopped:
            changed = self._changed
            if self.ready.is_set() and self._version != seen:
                seen = self._version
                yield self._revision, self.snapshot()
                continue
            await changed.wait()

    # -- internals ---------------------------------------------------------------------------------------
    def _notify(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def _decode(self, key: str, raw: bytes) -> tuple[T] | None:
        """``(value,)``, or None when ``raw`` does not decode (the value itself may be None)."""
        try:
            return (self.decode(raw),)
        except Exception as e:
            log.warning("view %s: skipping undecodable value at %s: %s", self.prefix, key, e)
            return None

    def _leaf(self, key: str) -> str:
        return key[len(self.prefix) :]

    def _load(self, kvs: dict[str, bytes], revision: int) -> None:
        if self.ready.is_set():
            self.relists += 1
        raw = {self._leaf(k): v for k, v in kvs.items()}
        changed = raw != self._raw or not self.ready.is_set()
        if changed:
            data: dict[str, T] = {}
            for leaf, v in raw.items():
                decoded = self._decode(leaf, v)
                if decoded is not None:
                    data[leaf] = decoded[0]
            self._raw, self._data = raw, data
        self._revision = revision
        self.ready.set()
        if changed:
            self._notify()

    def _apply(self, batch: list[WatchEvent]) -> None:
        raw, data = dict(self._raw), dict(self._data)
        for ev in batch:
            leaf = self._leaf(ev.key)
            if ev.kind == "put":
                raw[leaf] = ev.value
                decoded = self._decode(leaf, ev.value)
                if decoded is not None:
                    data[leaf] = decoded[0]
                else:
                    data.pop(leaf, None)
            else:
                raw.pop(leaf, None)
                data.pop(leaf, None)
        self._raw, self._data, self._revision = raw, data, batch[-1].mod_revision
        self._notify()

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                kvs, rev = await self.client.get_prefix(self.prefix)
                self._load(kvs, rev)
                backoff = 0.1
                async with contextlib.aclosing(self.client.watch_prefix(self.prefix, rev + 1)) as events:
                    async for batch in events:
                        self._apply(batch)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("view %s: %s; re-listing in %.1fs", self.prefix, e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
