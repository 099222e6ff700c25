"""The native executor's hand-off of output to the consumers' event loops.

Output items go straight into each request's :class:`~llmfleet_engine.stream.ChunkSink`; what this
module schedules is the *wake-up* of the consumers. During a worker iteration the requests given
output are collected; after it, their consumers are woken with one ``call_soon_threadsafe`` per event
loop. With ``interval_s > 0`` the worker wakes at most once per interval (a stream interval): items
wait in their sinks, and the next wake hands each consumer all of them at once, which saves the
per-token wake-ups and the GIL hand-offs between the worker and the event loop. First tokens, final
chunks and output emitted outside the worker's iterations are never held back, and the worker
releases what it holds before it waits for work.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Protocol

from llmfleet_engine.stream import ChunkSink, LoopWaker, SinkItem
from llmfleet_engine.text import TextStream


class Streamed(Protocol):
    """What delivery needs of a request: its output's way to the consumer (a ``LiveRequest``)."""

    sink: ChunkSink


class Delivery:
    """Wakes consumers for the worker thread ``worker`` (set by the executor). ``on_dead_loop`` gets the
    requests whose event loop is gone (nobody will read them)."""

    def __init__(self, on_dead_loop: Callable[[list[Streamed]], None], interval_s: float = 0.0) -> None:
        self.worker: threading.Thread | None = None
        self.interval_s = interval_s
        self._on_dead_loop = on_dead_loop
        self._lock = threading.Lock()
        self._wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWaker]
        self._wakers = weakref.WeakKeyDictionary()
        self._batch: list[Streamed] | None = None  # given output during the iteration in progress
        self._held: list[Streamed] = []  # given output, consumers not woken yet (stream interval)
        self._urgent = False
        self._last = 0.0

    def sink(
        self, request_id: str, loop: asyncio.AbstractEventLoop, text: TextStream | None, index: int
    ) -> ChunkSink:
        with self._lock:
            waker = self._wakers.get(loop)
            if waker is None:
                waker = self._wakers[loop] = LoopWaker(loop)
        return ChunkSink(request_id, waker, text, index)

    # ------------------------------------------------------------------ worker iterations
    def begin(self) -> list[Streamed]:
        """(worker) An iteration starts; returns the list to append requests given output to."""
        self._batch = []
        return self._batch

    def urgent(self) -> None:
        """(worker) Something in this iteration must reach its consumer now (a first or final chunk)."""
        self._urgent = True

    def end(self) -> None:
        """(worker) The iteration is over: wake its consumers, or hold them until the interval ends."""
        batch, self._batch = self._batch or [], None
        held = self._held
        held += batch
        if not held:
            return
        now = time.monotonic()
        if self._urgent or now - self._last >= self.interval_s:
            self._held, self._urgent, self._last = [], False, now
            self.deliver(held)

    def release(self) -> None:
        """(worker) Wake everything held (the worker is about to wait)."""
        if self._held:
            held, self._held, self._urgent = self._held, [], False
            self._last = time.monotonic()
            self.deliver(held)

    # -------------------------------------------------------------------------- any thread
    def emit(self, state: Streamed, item: SinkItem, urgent: bool = False) -> None:
        """Hand ``item`` to ``state``'s consumer: with the iteration's batch on the worker, else now."""
        state.sink.items.append(item)
        if self._batch is not None and threading.current_thread() is self.worker:
            self._batch.append(state)
            self._urgent = self._urgent or urgent
            return
        self.deliver([state])

    def deliver(self, states: list[Streamed]) -> None:
        """Wake the consumers of ``states``: one ``call_soon_threadsafe`` per event loop."""
        first = states[0].sink.waker
        if all(s.sink.waker is first for s in states):
            groups = {first: states}
        else:
            groups = {}
            for s in states:
                groups.setdefault(s.sink.waker, []).append(s)
        for waker, group in groups.items():
            try:
                waker.wake([s.sink for s in group])
            except RuntimeError:  # the consumer's loop is gone
                self._on_dead_loop(group)


class RateWindow:
    """Tokens generated over the last ``window_s`` seconds (the load snapshot's tokens/s)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()

    def add(self, now: float, n: int) -> None:
        self._events.append((now, n))
        self.trim(now)

    def trim(self, now: float) -> None:
        horizon, events = now - self.window_s, self._events
        while events and events[0][0] < horizon:
            events.popleft()

    def per_second(self, now: float) -> float:
        self.trim(now)
        return sum(n for _, n in self._events) / self.window_s
