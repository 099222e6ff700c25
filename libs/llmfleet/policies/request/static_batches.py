"""Static batching on the continuous-batching engine: a :class:`RequestPolicy` that runs any
:class:`~llmfleet.policies.batching.StaticBatchPolicy` (static SLS, SCLS slices, UELLM SLO-ODBS, S³).

Semantics (the live engine's static mode; the simulator runs static batchers natively):

* While a batch is active nothing joins it: new arrivals wait for the next ``form_batch``.
* A batch's first iteration prefills its new members (and decodes members that kept their KV from an
  earlier slice: a "mixed" iteration); then its members decode together until each finishes or the
  batch has run ``max_iterations`` iterations (an SCLS slice).
* Slice end: unfinished members are *parked* — they hold their KV and are offered to the next
  ``form_batch`` with their context as input length, so re-batching costs no recompute. (The papers'
  recompute mode, with padded rows, is the engine core's static mode: see
  ``llmfleet.policies.engine_policy``.)
* Padding is not materialised: the paged engine computes only real tokens, so a finished row costs
  nothing while it waits for the batch end (results stream at EOS).
* Preemption victim: a parked request first (it is not running), else the latest-arrived member.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from llmfleet.policies.batching.base import StaticBatch, StaticBatchPolicy
from llmfleet.policies.request.base import (
    Batch,
    BatchLimits,
    BatchPhase,
    PoolView,
    SchedRequest,
    arrival_key,
    batch_members,
    check_duration,
    mark_ran,
)


class StaticBatches:
    def __init__(self, batcher: StaticBatchPolicy) -> None:
        self.batcher = batcher
        self.name = f"static:{batcher.name}"
        self._batch: StaticBatch | None = None
        self._members: set[str] = set()
        self._iterations = 0

    @property
    def active(self) -> StaticBatch | None:
        return self._batch

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        self._members.discard(req.request_id)  # a preempted member is back in waiting: out of the batch
        self.batcher.on_arrival(req, now)

    def next_batch(
        self,
        waiting: Sequence[SchedRequest],
        running: Sequence[SchedRequest],
        pool: PoolView,
        limits: BatchLimits,
        now: float,
    ) -> Batch | None:
        if self._batch is not None and not self._live(waiting, running):
            self._end_batch()
        if self._batch is None:
            parked = [
                dataclasses.replace(r, prompt_tokens=r.context_tokens, generated=0, phase="prefill")
                for r in running
            ]
            sb = self.batcher.form_batch([*waiting, *parked], pool, limits, now)
            if sb is None:
                return None
            self._batch, self._members, self._iterations = sb, set(sb.request_ids), 0
        ids = self._members
        # prefills only until the first iteration ran (a member that did not fit then waits for the next)
        pre = [r for r in waiting if r.request_id in ids] if self._iterations == 0 else []
        dec = [r for r in running if r.request_id in ids]
        if not pre and not dec:
            self._end_batch()
            return None
        phase: BatchPhase = "mixed" if pre and dec else ("prefill" if pre else "decode")
        return Batch(self._batch.model, phase, tuple(r.request_id for r in (*dec, *pre)))

    def _live(self, waiting: Sequence[SchedRequest], running: Sequence[SchedRequest]) -> bool:
        ids = self._members
        return any(r.request_id in ids for r in running) or (
            self._iterations == 0 and any(r.request_id in ids for r in waiting)
        )

    def _end_batch(self) -> None:
        self._batch, self._members, self._iterations = None, set(), 0

    def on_iteration(
        self, batch: Batch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None:
        check_duration(duration_s)
        for r in batch_members(batch, requests):
            mark_ran(r, duration_s, now)
        if self._batch is None:
            return
        self._iterations += 1
        limit = self._batch.max_iterations
        if limit is not None and self._iterations >= limit:  # slice end: park the unfinished
            self.batcher.on_batch_done(self._batch, duration_s, now, list(requests))
            self._end_batch()

    def on_finish(self, req: SchedRequest, now: float) -> None:
        self._members.discard(req.request_id)
        if self._batch is not None and not self._members:
            self.batcher.on_batch_done(self._batch, 0.0, now, [req])
            self._end_batch()

    def preemption_victim(self, running: Sequence[SchedRequest], now: float) -> SchedRequest:
        if not running:
            raise ValueError("no running request to preempt")
        parked = [r for r in running if r.request_id not in self._members]
        return max(parked or running, key=arrival_key)
