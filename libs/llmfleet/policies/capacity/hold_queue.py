"""The queue of requests held for capacity: highest service priority first, then arrival order (the
request policy's FCFS within a priority), each with its own deadline. Removal (a cancelled request)
is O(1) and lazy. Pure: the scheduler and the simulator hold requests in it."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(order=True)
class _Entry(Generic[T]):
    rank: tuple[int, float, int]
    key: str = field(compare=False)
    item: T = field(compare=False)
    deadline: float = field(compare=False, default=float("inf"))
    live: bool = field(compare=False, default=True)


class HoldQueue(Generic[T]):
    """Items keyed by request id, popped by (−priority, arrival, insertion)."""

    def __init__(self) -> None:
        self._heap: list[_Entry[T]] = []
        self._by_key: dict[str, _Entry[T]] = {}
        self._seq = itertools.count()
        self._timed: set[str] = set()  # keys with a finite deadline: expiry scans only when some exist

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def push(
        self,
        key: str,
        item: T,
        arrival: float,
        priority: int = 0,
        deadline: float = float("inf"),
        tenant: str = "",
        cost: float = 0.0,
    ) -> None:
        """Hold ``item``; ``tenant`` and ``cost`` are what a fair queue orders by (unused here)."""
        if key in self._by_key:
            raise KeyError(f"{key!r} is held already")
        e = _Entry((-priority, arrival, next(self._seq)), key, item, deadline)
        self._by_key[key] = e
        heapq.heappush(self._heap, e)
        if deadline != float("inf"):
            self._timed.add(key)

    def _drop_dead(self) -> None:
        while self._heap and not self._heap[0].live:
            heapq.heappop(self._heap)

    def peek(self) -> T | None:
        self._drop_dead()
        return self._heap[0].item if self._heap else None

    def pop(self) -> T | None:
        self._drop_dead()
        if not self._heap:
            return None
        e = heapq.heappop(self._heap)
        del self._by_key[e.key]
        self._timed.discard(e.key)
        return e.item

    def charge(self, tenant: str, tokens: float) -> None:
        """A fair queue's correction of a tenant's tokens served: arrival order counts none."""

    def remove(self, key: str) -> T | None:
        """Take ``key`` out (None: not held)."""
        e = self._by_key.pop(key, None)
        if e is None:
            return None
        self._timed.discard(key)
        e.live = False
        return e.item

    def set_deadline(self, key: str, deadline: float) -> None:
        e = self._by_key.get(key)
        if e is not None:
            e.deadline = deadline
            (self._timed.add if deadline != float("inf") else self._timed.discard)(key)

    def expired(self, now: float) -> list[T]:
        """Take out every item whose deadline is <= ``now`` (in queue order)."""
        if not self._timed:  # nothing can expire: no scan (the pump runs on every end and report)
            return []
        gone = sorted(self._by_key[k] for k in self._timed if self._by_key[k].deadline <= now)
        for e in gone:
            self.remove(e.key)
        return [e.item for e in gone]

    def last_behind(self, priority: int, tenant: str, match: Callable[[T], bool]) -> str | None:
        """The key of the matching item that would be served last, when it would be served after a new
        one of ``priority`` (``tenant`` counts nothing here: one below ``priority``); None: none."""
        worst = max(
            (e for e in self._by_key.values() if e.rank[0] > -priority and match(e.item)), default=None
        )
        return worst.key if worst is not None else None

    def items(self) -> list[T]:
        """Held items in queue order."""
        return [e.item for e in sorted(self._by_key.values())]
