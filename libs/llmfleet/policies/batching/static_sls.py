"""Static sequence-level scheduling (SLS): FCFS static batches of a fixed maximum size.

The baseline of SCLS (Cheng et al., "Slice-Level Scheduling for High Throughput and Load Balanced LLM
Serving", 2024): a batch is formed once, in arrival order, and runs until its longest output ends
(``max_iterations=None``) or for at most ``max_iterations`` iterations.

Forming a batch (the engine is idle):

* Seed: the oldest waiting request (arrival, then id) whose padded admission
  ``padded_blocks(pool, [r], 1)`` fits ``pool.available_blocks``; the batch's model is its model.
  Older requests that do not fit even alone are passed over: nothing runs, so waiting cannot help
  (:func:`~llmfleet.policies.request.base.stuck_requests` names them for the engine to fail).
* Then the following waiting requests of that model, in arrival order, while the batch stays within
  ``min(batch_size, limits.max_requests)`` requests, its padded admission ``padded_blocks(pool,
  members, 1)`` (n rows of the longest prompt + 1) fits ``pool.available_blocks``, and its padded
  prefill ``n · longest prompt`` stays within ``limits.max_prefill_tokens`` (the seed alone is exempt,
  as a long prompt runs alone under continuous batching). It stops at the first request that does not
  fit: no later request jumps ahead (FCFS).
* ``None`` when nothing is waiting or nothing fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from llmfleet.policies.batching.base import (
    StaticBatch,
    first_fitting,
    mark_batch_ran,
    padded_blocks,
    padded_tokens,
)
from llmfleet.policies.checks import positive_int
from llmfleet.policies.request.base import (
    BatchLimits,
    PoolView,
    SchedRequest,
    arrival_key,
)


@dataclass(frozen=True)
class StaticSlsOptions:
    """SLS's options: ``batch_size``, the most requests a batch holds, and ``max_iterations``, the most
    iterations it runs (None: until its longest output ends)."""

    batch_size: int = 16
    max_iterations: int | None = None

    def __post_init__(self) -> None:
        positive_int("batch_size", self.batch_size)
        positive_int("max_iterations", self.max_iterations, optional=True)


class StaticSls:
    """FCFS static batches of up to ``batch_size`` requests of one model (SCLS's SLS baseline)."""

    name = "static_sls"
    Options: ClassVar[type[StaticSlsOptions]] = StaticSlsOptions

    def __init__(self, options: StaticSlsOptions | None = None) -> None:
        o = options if options is not None else StaticSlsOptions()
        self.batch_size = o.batch_size
        self.max_iterations = o.max_iterations

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        return None

    def form_batch(
        self, waiting: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits, now: float
    ) -> StaticBatch | None:
        waits = sorted(waiting, key=arrival_key)
        avail = pool.available_blocks
        start = first_fitting(waits, pool)
        if start is None:
            return None
        members = [waits[start]]
        cap = min(self.batch_size, limits.max_requests)
        for r in waits[start + 1 :]:
            if len(members) >= cap:
                break
            if r.model != members[0].model:
                continue
            trial = [*members, r]
            if padded_blocks(pool, trial, 1) > avail or padded_tokens(trial, 0) > limits.max_prefill_tokens:
                break
            members = trial
        return StaticBatch(members[0].model, tuple(r.request_id for r in members), self.max_iterations)

    def on_batch_done(
        self, batch: StaticBatch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None:
        mark_batch_ran(batch, duration_s, now, requests)
