"""Longest-prefix-first admission (SGLang's ``lpm`` scheduling policy), with an aging bound.

Batches are FCFS's (:mod:`llmfleet.policies.request.fcfs`: the model of the oldest request, its
decodes, its prefills while they fit the slots, the prefill tokens and the pool); only the order in
which waiting requests are admitted differs. Before each ``next_batch`` the engine core tells the
policy how many prompt tokens the pool holds cached now for up to ``lookahead`` of the waiting
requests it shows (the oldest; :meth:`LongestPrefix.on_cached`), and the policy admits first:

1. the *aged* requests, those waiting ``max_wait_s`` or longer since they arrived, in arrival order;
   the oldest of them is the head-of-line request of FCFS (when it does not fit the pool while
   something runs, no later prefill is admitted, so it gets in as memory frees up);
2. then the others, most cached prompt tokens first (ties, and requests not looked up, which count as
   none cached, in arrival order).

So a request whose prefix is still cached is prefilled before later prefills evict that prefix, and
none waits more than ``max_wait_s`` before it is admitted in FCFS order among the aged. With
``refresh`` (on) each lookup also makes the idle blocks it finds the most recently used in the pool's
LRU, so that while a request waits its prefix outlives idle blocks no waiting request needs. SGLang's
``SchedulePolicy.calc_priority`` (``policy="lpm"``) sorts its waiting queue by the prefix each
request matches in the radix cache and falls back to FCFS past 128 waiting requests; here the lookup
is bounded the same way (``lookahead``, 128) and the requests past it keep their FCFS order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from llmfleet.policies.request.base import Batch, SchedRequest
from llmfleet.policies.request.fcfs import Fcfs, FcfsOptions


@dataclass(frozen=True)
class LongestPrefixOptions(FcfsOptions):
    """``lookahead``: waiting requests whose cached prefix the core looks up per step (the oldest);
    ``max_wait_s``: the aging bound, after which a waiting request is admitted in FCFS order before
    any not yet aged; ``refresh``: a lookup makes the blocks it finds the most recently used in the
    pool's LRU (as SGLang's prefix match refreshes the matched nodes' access time)."""

    lookahead: int = 128
    max_wait_s: float = 5.0
    refresh: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.lookahead, bool) or not isinstance(self.lookahead, int) or self.lookahead < 1:
            raise ValueError(f"lookahead must be an int >= 1, got {self.lookahead!r}")
        if not isinstance(self.max_wait_s, int | float) or not (
            math.isfinite(self.max_wait_s) and self.max_wait_s >= 0
        ):
            raise ValueError(f"max_wait_s must be a finite number >= 0, got {self.max_wait_s!r}")
        if not isinstance(self.refresh, bool):
            raise ValueError(f"refresh must be a bool, got {self.refresh!r}")


class LongestPrefix(Fcfs):
    """FCFS batches; waiting requests admitted most cached prompt tokens first, aged ones before them."""

    name = "longest_prefix"
    Options: ClassVar[type[LongestPrefixOptions]] = LongestPrefixOptions

    def __init__(self, options: LongestPrefixOptions | None = None) -> None:
        opts = options if options is not None else LongestPrefixOptions()
        super().__init__(opts)
        self.prefix_lookahead = opts.lookahead
        self.max_wait_s = float(opts.max_wait_s)
        self.prefix_refresh = opts.refresh
        self.cached: Mapping[str, int] = {}

    def on_cached(self, cached: Mapping[str, int]) -> None:
        """The prompt tokens the pool holds cached now for the waiting requests the core looked up (by
        request id), for the ``next_batch`` that follows."""
        self.cached = cached

    def admission_order(
        self, waits: list[SchedRequest], now: float
    ) -> tuple[list[SchedRequest], SchedRequest | None]:
        return prefix_order(waits, self.cached, now, self.max_wait_s)

    def stable_until(
        self, batch: Batch, waiting: Sequence[SchedRequest], running: Sequence[SchedRequest], now: float
    ) -> float:
        """A pure-decode batch with nothing waiting stays the choice until an arrival or a finish; with
        requests waiting, aging and evictions reorder them, so any batch may change at the next step."""
        return math.inf if batch.phase == "decode" and not waiting else now


def prefix_order(
    waits: Sequence[SchedRequest], cached: Mapping[str, int], now: float, max_wait_s: float
) -> tuple[list[SchedRequest], SchedRequest | None]:
    """``waits`` (in arrival order) in admission order: those waiting ``max_wait_s`` or longer in
    arrival order, then the rest by most ``cached`` prompt tokens (absent: none), ties in arrival
    order; and the head-of-line request, the oldest aged one (None when none has aged)."""
    aged = [r for r in waits if now - r.arrival_s >= max_wait_s]
    fresh = [r for r in waits if now - r.arrival_s < max_wait_s]
    fresh.sort(key=lambda r: -cached.get(r.request_id, 0))  # stable: ties keep arrival order
    return [*aged, *fresh], (aged[0] if aged else None)
