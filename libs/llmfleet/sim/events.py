"""The simulator's clock and event heap.

Event kinds are also the order of events at the same instant (then insertion order): a model ready at t
serves an arrival at t, and an arrival at the very end of an iteration joins the next batch. The order
never depends on when an event was pushed, so a partitioned run (``workers``) orders each instance's
events exactly as a serial one."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

READY, ARRIVAL, MOVE, END, HOOK, SAMPLE = -1, 0, 1, 2, 3, 4


class EventQueue:
    """Simulated time (``now``) and the pending events, (time, kind, insertion number, a, b) in a heap.
    The simulator's loop pops them and advances ``now``; its parts (the fleet, the hooks) push them."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple] = []
        self._seq = 0
        self.one_shots = 0  # hooks scheduled with at()

    def __bool__(self) -> bool:
        return bool(self._heap)

    def push(self, t: float, kind: int, a: object = None, b: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, a, b))

    def pop(self) -> tuple[float, int, Any, Any]:
        """The next event (time, kind, a, b); ``now`` moves to its time (never backwards)."""
        t, kind, _, a, b = heapq.heappop(self._heap)
        if t < self.now - 1e-9:
            raise RuntimeError(f"event at {t} before now {self.now}: time went backwards")
        self.now = t
        return t, kind, a, b

    def at(self, t: float, fn: Callable[[Any, float], None]) -> None:
        """Call ``fn(sim, t)`` once at simulated time ``t`` (not before now)."""
        if t < self.now:
            raise ValueError(f"cannot schedule a hook at {t}, before now ({self.now})")
        self.one_shots += 1
        self.push(t, HOOK, None, fn)  # no period: once
