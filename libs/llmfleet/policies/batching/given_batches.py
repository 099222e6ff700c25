"""Static batches formed upstream: the engine half of SCLS central scheduling (Cheng et al. 2024, §4).

The paper's scheduler keeps the request pool, partitions it with the DP (Algorithm 1) every interval
(Eq. 12) and offloads each batch to a worker (Eq. 11); the worker serves the batch as one static batch
for one slice. Here the scheduler tags each member with ``batch_id`` / ``batch_size`` and caps its
``max_tokens`` at the slice end; this policy runs exactly those batches:

* a batch runs once all ``batch_size`` members have arrived, or ``wait_s`` after its first one did (a
  member cancelled on the way must not hold the others); complete batches run in the order their
  first member arrived;
* requests without a batch tag run alone, first come first served (a request sent by anything else);
* no ``max_iterations``: the members' ``max_tokens`` end the slice, so a batch lasts at most one slice;
* memory: as many members (in arrival order) as the padded batch fits; the rest wait for the next
  ``form_batch`` (never happens when the scheduler sized the batch for this engine's pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from llmfleet.policies.batching.base import StaticBatch, mark_batch_ran, padded_blocks
from llmfleet.policies.request.base import (
    BatchLimits,
    PoolView,
    SchedRequest,
    arrival_key,
)


@dataclass(frozen=True)
class GivenBatchesOptions:
    """``wait_s``: how long an incomplete batch waits for its missing members after its first one
    arrived."""

    wait_s: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.wait_s, bool) or not (isinstance(self.wait_s, int | float) and self.wait_s >= 0):
            raise ValueError(f"wait_s must be >= 0, got {self.wait_s!r}")


class GivenBatches:
    name = "given"
    Options: ClassVar[type[GivenBatchesOptions]] = GivenBatchesOptions

    def __init__(self, options: GivenBatchesOptions | None = None) -> None:
        self.wait_s = float((options if options is not None else GivenBatchesOptions()).wait_s)
        self._first_seen: dict[str, float] = {}  # batch id -> when its first member arrived

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        if req.batch_id:
            self._first_seen.setdefault(req.batch_id, now)

    def form_batch(
        self, waiting: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits, now: float
    ) -> StaticBatch | None:
        groups: dict[str, list[SchedRequest]] = {}
        for r in sorted(waiting, key=arrival_key):
            groups.setdefault(r.batch_id or f"\0{r.request_id}", []).append(r)
        for key, members in groups.items():
            head = members[0]
            if head.batch_id:
                first = self._first_seen.setdefault(head.batch_id, now)
                if len(members) < head.batch_size and now - first < self.wait_s:
                    continue  # the rest of the batch is on its way
            members = [r for r in members if r.model == head.model][: limits.max_requests]
            n = len(members)
            while n > 1 and padded_blocks(pool, members[:n], 1) > pool.available_blocks:
                n -= 1
            if padded_blocks(pool, members[:n], 1) > pool.available_blocks:
                return None  # not even one fits now: wait for memory
            if head.batch_id and n == len(groups[key]):
                self._first_seen.pop(head.batch_id, None)
            return StaticBatch(head.model, tuple(r.request_id for r in members[:n]))
        return None

    def on_batch_done(
        self, batch: StaticBatch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None:
        mark_batch_ran(batch, duration_s, now, requests)
