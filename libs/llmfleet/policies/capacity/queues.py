"""The order in which held requests leave: what the two hold queues have in common, and the one that a
``fairness`` setting names. ``none``: :class:`~llmfleet.policies.capacity.hold_queue.HoldQueue`
(priority, then arrival); ``vtc``: :class:`~llmfleet.policies.capacity.vtc_fair.FairQueue`
(priority, then fair among tenants by tokens served, then arrival)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from llmfleet.policies.capacity.hold_queue import HoldQueue
from llmfleet.policies.capacity.vtc_fair import FairQueue
from llmfleet.spec.defaults import FAIRNESS_MODES, Fairness

T = TypeVar("T")


class HeldQueue(Protocol[T]):
    """Requests held for capacity, keyed by request id; each has a priority (higher leaves first), a
    tenant (the API key's name, "" when none), its weighted tokens (``cost``) and a deadline."""

    def __len__(self) -> int: ...

    def __contains__(self, key: str) -> bool: ...

    def push(
        self,
        key: str,
        item: T,
        arrival: float,
        priority: int = 0,
        deadline: float = float("inf"),
        tenant: str = "",
        cost: float = 0.0,
    ) -> None: ...

    def peek(self) -> T | None: ...

    def pop(self) -> T | None: ...

    def remove(self, key: str) -> T | None: ...

    def charge(self, tenant: str, tokens: float) -> None: ...

    def set_deadline(self, key: str, deadline: float) -> None: ...

    def expired(self, now: float) -> list[T]: ...

    def last_behind(self, priority: int, tenant: str, match: Callable[[T], bool]) -> str | None: ...

    def items(self) -> list[T]: ...


def make_hold_queue(fairness: Fairness) -> HeldQueue[T]:
    """An empty hold queue ordered as ``fairness`` says."""
    if fairness == "vtc":
        return FairQueue()
    if fairness == "none":
        return HoldQueue()
    raise ValueError(f"fairness must be one of {FAIRNESS_MODES}, got {fairness!r}")
