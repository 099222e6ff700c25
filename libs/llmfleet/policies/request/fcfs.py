"""FCFS continuous batching, vLLM-like, over several models sharing one engine (the baseline).

Per iteration: take the model of the oldest request (by arrival, ties by request id) among waiting and
running; its batch is all its running decodes (oldest first, up to ``max_requests``) plus its waiting
prefills in arrival order while they fit (slots, prefill tokens, pool). A model with nothing runnable is
skipped for the next model by oldest arrival.

Head-of-line rule (strict FCFS, no silent starvation): when the oldest waiting request overall does not
fit the pool and something is running (which will free KV), no later prefill of any model is admitted;
decodes still run, so memory frees up and the head gets in. When nothing runs, waiting cannot help the
head (``stuck_requests`` names it), so later requests are admitted instead of idling forever.

Victim: the most recently arrived running request (vLLM's policy).

``single_phase=True`` (vLLM 0.2–0.4's default scheduler): an iteration is ALL prefills or ALL decodes,
prefill first. The model is chosen as above; if any of its waiting requests can be admitted (same
head-of-line rule, same limits and pool check, and no more than ``max_requests`` running + admitted
requests of that model), the iteration is those prefills alone; only when none can be admitted does it
decode that model's running requests. This is ``Scheduler._schedule`` in ``vllm/core/scheduler.py``
of vLLM v0.2.x–v0.3.x ("Join waiting sequences if possible": waiting groups are admitted in FCFS order
until one cannot be allocated, exceeds ``max_num_batched_tokens`` or would push the running count past
``max_num_seqs``; ``if scheduled or ignored_seq_groups: return SchedulerOutputs(..., prompt_run=True)``
— decodes are scheduled only when no prompt was), kept by v0.4's ``_schedule_default`` without chunked
prefill ("Don't schedule decodes if prefills are scheduled"). vLLM's swapped queue (swap-in before
admission) has no counterpart here: the simulator and engine preempt by recomputation, which vLLM uses
for single-sequence requests, and a recomputed request waits like a new one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from llmfleet.policies.request.base import (
    Batch,
    BatchLimits,
    BatchPhase,
    PoolView,
    SchedRequest,
    admit_prefills,
    arrival_key,
    batch_members,
    check_duration,
    fits_alone,
    mark_ran,
)


@dataclass(frozen=True)
class FcfsOptions:
    """FCFS's options: ``single_phase``, one phase per batch, prefill first (vLLM 0.2–0.4), instead of
    prefills and decodes mixed."""

    single_phase: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.single_phase, bool):
            raise ValueError(f"single_phase must be a bool, got {self.single_phase!r}")


class Fcfs:
    """First come, first served; one model per batch, prefills and decodes of that model mixed, or with
    ``single_phase`` one phase per batch, prefill first (vLLM 0.2–0.4)."""

    name = "fcfs"
    Options: ClassVar[type[FcfsOptions]] = FcfsOptions
    single_phase: bool = False  # (a class default too: subclasses that skip __init__ stay mixed-phase)

    def __init__(self, options: FcfsOptions | None = None) -> None:
        self.single_phase = (options if options is not None else FcfsOptions()).single_phase

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        return None

    def next_batch(
        self,
        waiting: Sequence[SchedRequest],
        running: Sequence[SchedRequest],
        pool: PoolView,
        limits: BatchLimits,
        now: float,
    ) -> Batch | None:
        if not waiting and not running:
            return None
        runs = sorted(running, key=arrival_key)
        if not waiting:  # decodes only (the common case): the oldest request's model, all its decodes
            model = runs[0].model
            decodes = [r for r in runs if r.model == model][: limits.max_requests]
            return Batch(model, "decode", tuple([r.request_id for r in decodes]))
        waits = sorted(waiting, key=arrival_key)
        order, head = self.admission_order(waits, now)
        oldest: dict[str, tuple[float, str]] = {}
        for queue in (waits, runs):  # sorted: a model's first request in each queue is its oldest there
            seen: set[str] = set()
            for r in queue:
                if r.model in seen:
                    continue
                seen.add(r.model)
                k = arrival_key(r)
                if r.model not in oldest or k < oldest[r.model]:
                    oldest[r.model] = k
        head_blocked = head is not None and bool(runs) and not fits_alone(pool, head)
        models = sorted(oldest, key=lambda m: (oldest[m], m)) if len(oldest) > 1 else list(oldest)
        for model in models:
            decodes = [r for r in runs if r.model == model][: limits.max_requests]
            prefills: list[SchedRequest] = []
            if not head_blocked:
                if self.single_phase:  # vLLM: running + admitted <= max_num_seqs
                    slots = limits.max_requests - sum(1 for r in runs if r.model == model)
                else:
                    slots = limits.max_requests - len(decodes)
                prefills = admit_prefills((r for r in order if r.model == model), pool, limits, slots)
            if self.single_phase and prefills:
                return Batch(model, "prefill", tuple([r.request_id for r in prefills]))
            if decodes or prefills:
                phase: BatchPhase = "mixed" if decodes and prefills else ("decode" if decodes else "prefill")
                return Batch(model, phase, tuple([r.request_id for r in (*decodes, *prefills)]))
        return None

    def admission_order(
        self, waits: list[SchedRequest], now: float
    ) -> tuple[list[SchedRequest], SchedRequest | None]:
        """The order in which waiting requests (``waits``, in arrival order) are admitted, and the head:
        the request that, not fitting the pool while something runs, holds back every later prefill
        (None: no such request). FCFS: arrival order, the oldest as the head."""
        return waits, waits[0]

    def stable_until(
        self, batch: Batch, waiting: Sequence[SchedRequest], running: Sequence[SchedRequest], now: float
    ) -> float:
        """How long ``batch`` stays the answer if only time passes (the simulator's fast-forward).

        A pure-decode batch stays FCFS's choice until an arrival, a finish or a preemption: free blocks
        only shrink while decoding, so no waiting prefill becomes admissible and the model order by
        oldest arrival does not change. Any other batch may change at the next iteration.
        """
        return math.inf if batch.phase == "decode" else now

    def on_iteration(
        self, batch: Batch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None:
        check_duration(duration_s)
        for r in batch_members(batch, requests):
            mark_ran(r, duration_s, now)

    def on_finish(self, req: SchedRequest, now: float) -> None:
        return None

    def preemption_victim(self, running: Sequence[SchedRequest], now: float) -> SchedRequest:
        if not running:
            raise ValueError("no running request to preempt")
        return max(running, key=arrival_key)
