"""Fair queueing among tenants by tokens served: the virtual token counter (VTC) of Sheng et al.,
"Fairness in Serving Large Language Models" (OSDI '24), inside priority bands.

Each tenant (an API key) has a counter that grows by the weighted tokens it is served: a request's
prompt tokens plus twice its output tokens (:func:`weighted_tokens`) (charged when it
leaves the queue, from the caller's estimate; :meth:`FairQueue.charge` corrects it with the tokens it
really generated). The queue serves the highest priority band first; within a band, the backlogged
tenant with the smallest counter (of equal ones, the tenant holding fewer tokens, then the earlier
arrival), and that tenant's requests in arrival order. A tenant that becomes backlogged (it had nothing
held) is lifted to the smallest counter of the tenants backlogged then, so time spent idle banks no
credit (at that counter, a light tenant goes before the backlog it ties with). Removal (a cancelled or
shed request) is O(1) and lazy; choosing the next request is O(tenants in the top band). Pure: the
scheduler and the simulator hold requests in it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

INPUT_WEIGHT = 1.0  # the paper's w_p: a prompt token's weight
OUTPUT_WEIGHT = 2.0  # the paper's w_q: an output token costs about twice a prompt token to serve


def weighted_tokens(prompt_tokens: float, output_tokens: float) -> float:
    """What serving ``prompt_tokens`` and ``output_tokens`` adds to a tenant's counter."""
    return prompt_tokens * INPUT_WEIGHT + output_tokens * OUTPUT_WEIGHT


@dataclass(order=True)
class _Entry(Generic[T]):
    rank: tuple[float, int]  # (arrival, insertion): the order within one tenant
    key: str = field(compare=False)
    item: T = field(compare=False)
    priority: int = field(compare=False, default=0)
    tenant: str = field(compare=False, default="")
    cost: float = field(compare=False, default=0.0)
    deadline: float = field(compare=False, default=float("inf"))
    live: bool = field(compare=False, default=True)


class FairQueue(Generic[T]):
    """Items keyed by request id, popped by priority band, then the smallest virtual token counter
    among the tenants backlogged in the band, then arrival."""

    def __init__(self) -> None:
        self._bands: dict[int, dict[str, list[_Entry[T]]]] = {}  # priority -> tenant -> its heap
        self._band_live: dict[int, int] = {}  # priority -> live entries
        self._by_key: dict[str, _Entry[T]] = {}
        self._backlog: dict[str, int] = {}  # tenant -> live entries held (any band)
        self._held_cost: dict[str, float] = {}  # tenant -> the costs of its live entries
        self._counters: dict[str, float] = {}  # tenant -> virtual tokens served
        self._seq = itertools.count()
        self._timed: set[str] = set()  # keys with a finite deadline: expiry scans only when some exist

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def counter(self, tenant: str) -> float:
        """``tenant``'s virtual token counter."""
        return self._counters.get(tenant, 0.0)

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
        if key in self._by_key:
            raise KeyError(f"{key!r} is held already")
        self._counters[tenant] = self._lifted(tenant)
        self._backlog[tenant] = self._backlog.get(tenant, 0) + 1
        self._held_cost[tenant] = self._held_cost.get(tenant, 0.0) + cost
        e = _Entry((arrival, next(self._seq)), key, item, priority, tenant, cost, deadline)
        self._by_key[key] = e
        heapq.heappush(self._bands.setdefault(priority, {}).setdefault(tenant, []), e)
        self._band_live[priority] = self._band_live.get(priority, 0) + 1
        if deadline != float("inf"):
            self._timed.add(key)

    def _lifted(self, tenant: str) -> float:
        """``tenant``'s counter once it holds a request: one that becomes backlogged is lifted to the
        smallest counter of the tenants backlogged now."""
        mine = self._counters.get(tenant, 0.0)
        if self._backlog.get(tenant):
            return mine
        backlogged = [self._counters.get(t, 0.0) for t, n in self._backlog.items() if n]
        return max(mine, min(backlogged)) if backlogged else mine

    def _head(self) -> _Entry[T] | None:
        if not self._band_live:
            return None
        band = max(self._band_live)
        tenants = self._bands[band]
        best: _Entry[T] | None = None
        best_rank: tuple[float, float, tuple[float, int]] | None = None
        for tenant in list(tenants):
            heap = tenants[tenant]
            while heap and not heap[0].live:
                heapq.heappop(heap)
            if not heap:
                del tenants[tenant]
                continue
            rank = (self._counters.get(tenant, 0.0), self._held_cost.get(tenant, 0.0), heap[0].rank)
            if best_rank is None or rank < best_rank:
                best, best_rank = heap[0], rank
        return best

    def peek(self) -> T | None:
        e = self._head()
        return e.item if e is not None else None

    def pop(self) -> T | None:
        """Take the next item out, charging its tenant its cost."""
        e = self._head()
        if e is None:
            return None
        heapq.heappop(self._bands[e.priority][e.tenant])
        self._take(e)
        self._counters[e.tenant] = self._counters.get(e.tenant, 0.0) + e.cost
        return e.item

    def charge(self, tenant: str, tokens: float) -> None:
        """Add ``tokens`` weighted tokens to ``tenant``'s counter (negative: give back an overestimate)."""
        self._counters[tenant] = self._counters.get(tenant, 0.0) + tokens

    def _take(self, e: _Entry[T]) -> None:
        del self._by_key[e.key]
        self._timed.discard(e.key)
        e.live = False
        self._backlog[e.tenant] -= 1
        self._held_cost[e.tenant] = self._held_cost[e.tenant] - e.cost if self._backlog[e.tenant] else 0.0
        self._band_live[e.priority] -= 1
        if not self._band_live[e.priority]:
            del self._band_live[e.priority]
            del self._bands[e.priority]  # its heaps hold only dead entries now

    def remove(self, key: str) -> T | None:
        """Take ``key`` out, uncharged (None: not held)."""
        e = self._by_key.get(key)
        if e is None:
            return None
        self._take(e)
        return e.item

    def set_deadline(self, key: str, deadline: float) -> None:
        e = self._by_key.get(key)
        if e is not None:
            e.deadline = deadline
            (self._timed.add if deadline != float("inf") else self._timed.discard)(key)

    def expired(self, now: float) -> list[T]:
        """Take out every item whose deadline is <= ``now`` (by priority, then arrival)."""
        if not self._timed:
            return []
        gone = sorted((self._by_key[k] for k in self._timed if self._by_key[k].deadline <= now), key=_order)
        for e in gone:
            self._take(e)
        return [e.item for e in gone]

    def last_behind(self, priority: int, tenant: str, match: Callable[[T], bool]) -> str | None:
        """The key of the matching item that would be served last, when it would be served after a new
        one of ``priority`` from ``tenant``: in a lower band, or in the same band from a tenant whose
        counter, once its requests ahead are served, passes where ``tenant``'s new one would start.
        The last is in the lowest band, of the tenant with the largest counter plus held tokens, its
        latest arrival. None: none."""
        if not self._band_live or min(self._band_live) > priority:
            return None
        worst = max((e for e in self._by_key.values() if match(e.item)), key=self._last, default=None)
        if worst is None:
            return None
        starts = self._finish(worst.tenant) - worst.cost  # its counter when the last one would go
        mine = self._lifted(tenant) + self._held_cost.get(tenant, 0.0)
        behind = worst.priority < priority or (
            worst.priority == priority and worst.tenant != tenant and starts > mine
        )
        return worst.key if behind else None

    def _finish(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0) + self._held_cost.get(tenant, 0.0)

    def _last(self, e: _Entry[T]) -> tuple[int, float, tuple[float, int]]:
        return (-e.priority, self._finish(e.tenant), e.rank)

    def items(self) -> list[T]:
        """Held items by priority, then arrival."""
        return [e.item for e in sorted(self._by_key.values(), key=_order)]


def _order(e: _Entry[T]) -> tuple[int, tuple[float, int]]:
    return (-e.priority, e.rank)
