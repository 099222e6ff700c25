"""The engine core: one pure object that runs an engine's request table, queues, KV blocks and policy.

Shaped like vLLM V1's scheduler (schedule → execute → update): the driver calls ``schedule(now)`` for
a :class:`StepPlan`, executes it (the live executor: a forward pass and sampling; the simulator: the
cost model's time), then ``complete(plan, now, ...)`` applies its effects. No threads, no I/O, no clock
reads: both the live engine and the simulator drive the very same object, so their batch sequences,
preemptions and finish orders are the same by construction (``libs/tests/engine_core/test_parity.py``).

Two modes, chosen by the policy's type:

* **continuous** — a :class:`~llmfleet.policies.request.RequestPolicy` (FCFS, SeaLLM's doubling budget,
  MuxServe RR, or a static batcher kept over continuous batching by ``StaticBatches``) picks each
  iteration's batch. A prefill takes ``sched.prompt_tokens`` tokens of KV; a decode appends one slot
  (all members at once when they fit, else one by one, preempting by recompute the victim the policy
  names). A plan whose every member was preempted runs nothing: the policy is asked again.
* **static** — a :class:`~llmfleet.policies.batching.StaticBatchPolicy` (static SLS, SCLS, UELLM,
  S³) as HF ``generate`` runs it: ``form_batch`` when idle, every row padded to the longest prompt, all
  rows (finished ones as padding) grow one slot per iteration until every row finished, the slice's
  ``max_iterations`` ran, or the pool cannot grow (an OOM slice end). At the batch end all rows free
  their KV and the unfinished go back to waiting to be re-prefilled with prompt + output so far.

The policy calling contract is the one in ``llmfleet.policies.request.base`` and
``llmfleet.policies.batching.base``; this module is its only implementation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Protocol, runtime_checkable

from llmfleet.engine_core.limits import EngineLimits
from llmfleet.engine_core.request import CoreRequest, StepPlan, StepResult
from llmfleet.engine_core.static_mode import StaticMode
from llmfleet.kvblocks import BlockAllocator, OutOfBlocks
from llmfleet.policies.batching.base import StaticBatch, StaticBatchPolicy
from llmfleet.policies.request.base import (
    Batch,
    PoolView,
    RequestPolicy,
    SchedRequest,
    stuck_requests,
)


@runtime_checkable
class ChunkablePolicy(Protocol):
    """A request policy that can promise its choice stays the same while only time passes (the
    simulator's exact fast-forward) and be charged a run of iterations at once."""

    def stable_until(
        self, batch: Batch, waiting: Sequence[SchedRequest], running: Sequence[SchedRequest], now: float
    ) -> float: ...


@runtime_checkable
class RunChargedPolicy(Protocol):
    def on_iterations(
        self, batch: Batch, durations_s: Sequence[float], now: float, requests: Sequence[SchedRequest]
    ) -> None: ...


class EngineCore(StaticMode):
    """An engine's scheduling state. ``allocator`` may hold other sequences (the live engine reserves
    model weights in it); ``watermark_blocks`` is what admissions leave free (settable)."""

    def __init__(
        self,
        policy: RequestPolicy | StaticBatchPolicy,
        allocator: BlockAllocator,
        limits: EngineLimits | None = None,
        watermark_blocks: int | None = None,
    ) -> None:
        self.policy = policy
        self.static = isinstance(policy, StaticBatchPolicy) and not isinstance(policy, RequestPolicy)
        self.chunkable = isinstance(policy, ChunkablePolicy)
        self.run_charged = isinstance(policy, RunChargedPolicy)
        self.alloc = allocator
        self.limits = limits or EngineLimits()
        self.batch_limits = self.limits.batch
        self.watermark_blocks = allocator.watermark_blocks if watermark_blocks is None else watermark_blocks
        self.tpb: dict[str, int] = {}
        self.requests: dict[str, CoreRequest] = {}
        self.waiting: dict[str, CoreRequest] = {}
        self.running: dict[str, CoreRequest] = {}
        self.failed: list[tuple[CoreRequest, str]] = []  # stuck requests, drained by the driver
        self.preemptions = 0
        self.requeues = 0  # static mode: unfinished rows sent back to waiting at a batch end
        self._plan: StepPlan | None = None
        self._deferred: list[str] = []  # KV of dropped in-flight members, freed at complete
        self._pool: PoolView | None = None
        self._paused = 0
        # static mode: the batch in progress
        self._sbatch: StaticBatch | None = None
        self._srows: list[CoreRequest] = []
        self._sdone: set[str] = set()
        self._siters = 0
        self._sdur = 0.0
        self._slongest = 0

    # ------------------------------------------------------------------------------------ models
    def add_model(self, model: str) -> None:
        """Make ``model`` schedulable (it must be registered in the allocator)."""
        self.tpb[model] = self.alloc.tokens_per_block(model)
        self._pool = None

    def remove_model(self, model: str) -> None:
        self.tpb.pop(model, None)
        self._pool = None

    def pool_view(self) -> PoolView:
        pool = self._pool
        free = self.alloc.free_blocks
        if pool is None or pool.free_blocks != free or pool.watermark_blocks != self.watermark_blocks:
            pool = self._pool = PoolView(free, self.watermark_blocks, self.tpb)
        return pool

    # ---------------------------------------------------------------------------------- requests
    @property
    def queued(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, r: CoreRequest, now: float) -> None:
        """A new request (phase prefill) enters waiting; the policy's ``on_arrival``."""
        self._register(r)
        self._enqueue(r, now)

    def _register(self, r: CoreRequest) -> str:
        rid = r.sched.request_id
        if rid in self.requests:
            raise ValueError(f"request {rid!r} is already in the engine")
        if r.sched.model not in self.tpb:
            raise ValueError(f"model {r.sched.model!r} is not served here; known: {sorted(self.tpb)}")
        self.requests[rid] = r
        return rid

    def _enqueue(self, r: CoreRequest, now: float) -> None:
        r.sched.phase = "prefill"
        self.waiting[r.sched.request_id] = r
        self.policy.on_arrival(r.sched, now)

    def land(self, r: CoreRequest, now: float, kv_tokens: int = 0, reserved: bool = False) -> bool:
        """A request migrated in. With ``kv_tokens`` (= its context − 1) its KV comes along: it joins
        running if the blocks are (``reserved``: the caller already reserved them) or can be allocated
        here; otherwise it re-prefills prompt + output so far. True when it landed with its KV."""
        rid = self._register(r)
        if kv_tokens and (reserved or self.alloc.can_allocate(r.sched.model, kv_tokens)):
            if not reserved:
                self.alloc.reserve(rid, r.sched.model, kv_tokens)
            r.sched.phase = "decode"
            self.running[rid] = r
            self.policy.on_arrival(r.sched, now)
            return True
        if reserved and rid in self.alloc:
            self.alloc.free(rid)
        r.fold()
        self._enqueue(r, now)
        return False

    def drop(self, request_id: str) -> CoreRequest | None:
        """Remove a request for good (cancelled, failed, migrated away): its KV is freed — after the
        step in flight if it is a member. No ``on_finish`` (the policy contract's cancel)."""
        r = self.requests.pop(request_id, None)
        if r is None:
            return None
        self.waiting.pop(request_id, None)
        self.running.pop(request_id, None)
        if r.paused:
            r.paused = False
            self._paused -= 1
        if self.in_flight(request_id):
            self._deferred.append(request_id)
        elif request_id in self.alloc:
            self.alloc.free(request_id)
        if self.static and self._sbatch is not None:
            self._srows = [x for x in self._srows if x is not r]
            self._sdone.discard(request_id)
        return r

    def remove(self, request_id: str) -> CoreRequest | None:
        """Take a queued or running request out to move it elsewhere (not one in the step in flight);
        None if it is not here or in flight."""
        if self.in_flight(request_id):
            return None
        return self.drop(request_id)

    def pause(self, request_id: str) -> CoreRequest:
        """Exclude a request from scheduling (its KV stays); ``resume`` puts it back."""
        r = self.requests[request_id]
        if not r.paused:
            r.paused = True
            self._paused += 1
        return r

    def resume(self, request_id: str) -> bool:
        r = self.requests.get(request_id)
        if r is None or not r.paused:
            return False
        r.paused = False
        self._paused -= 1
        return True

    def in_flight(self, request_id: str) -> bool:
        """Whether ``request_id`` is in the step between ``schedule`` and ``complete``."""
        plan = self._plan
        if plan is None:
            return False
        return any(r.sched.request_id == request_id for r in (plan.rows if plan.static else plan.members))

    @property
    def static_batch(self) -> StaticBatch | None:
        """Static mode: the batch in progress (None between batches and in continuous mode)."""
        return self._sbatch

    @property
    def inflight(self) -> set[str]:
        """Ids of the step in flight (between ``schedule`` and ``complete``): their KV is being written."""
        plan = self._plan
        if plan is None:
            return set()
        return {r.sched.request_id for r in (plan.rows if plan.static else plan.members)}

    def has_work(self) -> bool:
        """Anything schedulable (unpaused) is queued."""
        return len(self.waiting) + len(self.running) > self._paused

    # ---------------------------------------------------------------------------------- schedule
    def schedule(self, now: float) -> StepPlan | None:
        """The next step, its KV slots set up; None when nothing can run now. A plan whose members
        were all preempted launches nothing and the policy is asked again."""
        if self._plan is not None:
            raise RuntimeError("a step is already in flight: complete() it first")
        if self.static:
            plan = self._schedule_static(now)
        else:
            while True:
                before = (self.preemptions, len(self.waiting))
                plan = self._schedule_continuous(now)
                if plan is not None or (self.preemptions, len(self.waiting)) == before:
                    break
        if plan is not None:
            self._plan = plan
        return plan

    def _visible(self) -> tuple[list[CoreRequest], list[CoreRequest]]:
        waiting, running = self.waiting, self.running
        room = max(0, self.limits.max_running - len(running))
        if self._paused:
            w = [r for r in waiting.values() if not r.paused][:room]
            return w, [r for r in running.values() if not r.paused]
        if len(waiting) <= room:
            return list(waiting.values()), list(running.values())
        return list(islice(waiting.values(), room)), list(running.values())

    def _schedule_continuous(self, now: float) -> StepPlan | None:
        ws, rs = self._visible()
        scheds_w = [r.sched for r in ws]
        scheds_r = [r.sched for r in rs]
        pool = self.pool_view()
        batch = self.policy.next_batch(scheds_w, scheds_r, pool, self.batch_limits, now)  # type: ignore[union-attr]
        if batch is None:
            if not rs and not self._paused:
                self._fail_stuck(scheds_w, pool)
            return None
        members: list[CoreRequest] = []
        prefills: list[CoreRequest] = []
        preempted: list[CoreRequest] = []
        prefill = prefill_sq = decodes = ctx = 0
        ids = batch.request_ids
        reqs: list[CoreRequest]
        if batch.phase == "decode":  # the common case: one slot each, in one all-or-nothing step
            running = self.running
            try:
                reqs = [running[rid] for rid in ids]
            except KeyError:
                reqs = self._resolve(ids)
            try:
                self.alloc.grow_each(list(ids), 1)
            except OutOfBlocks:
                pass  # some decode needs a block that is not there: the per-request path preempts
            else:
                ctx = sum([r.sched.prompt_tokens + r.sched.generated for r in reqs])
                plan = StepPlan(batch, batch.model, reqs, [], [], 0, 0, len(reqs), ctx, scheds_w, scheds_r)
                return plan
        else:
            reqs = self._resolve(ids)
        for r in reqs:
            s = r.sched
            rid = s.request_id
            if s.phase == "prefill":
                try:
                    self.alloc.reserve(rid, s.model, s.prompt_tokens)
                except OutOfBlocks:
                    continue  # the policy over-admitted; it retries next iteration
                del self.waiting[rid]
                self.running[rid] = r
                s.phase = "decode"
                prefill += s.prompt_tokens
                prefill_sq += s.prompt_tokens * s.prompt_tokens
                prefills.append(r)
            else:
                if not self._append_or_preempt(r, members, preempted, now):
                    continue
                decodes += 1
                ctx += s.context_tokens
            members.append(r)
        if not members:
            return None
        return StepPlan(
            batch,
            batch.model,
            members,
            prefills,
            preempted,
            prefill,
            prefill_sq,
            decodes,
            ctx,
            scheds_w,
            scheds_r,
        )

    def _resolve(self, ids: Sequence[str]) -> list[CoreRequest]:
        out = []
        for rid in ids:
            r = self.waiting.get(rid) or self.running.get(rid)
            if r is None or r.paused:
                raise RuntimeError(f"policy {self.policy.name} batched unknown request {rid!r}")
            out.append(r)
        return out

    def _append_or_preempt(
        self, r: CoreRequest, members: list[CoreRequest], preempted: list[CoreRequest], now: float
    ) -> bool:
        while True:
            try:
                self.alloc.append_slot(r.sched.request_id)
                return True
            except OutOfBlocks:
                cands = [x for x in self.running.values() if x is not r and not x.paused and x not in members]
                by_id = {id(x.sched): x for x in [*cands, r]}
                victim = by_id[id(self.policy.preemption_victim([x.sched for x in [*cands, r]], now))]
                self._preempt(victim, now)
                preempted.append(victim)
                if victim is r:
                    return False

    def _preempt(self, r: CoreRequest, now: float) -> None:
        """Preemption by recompute: drop the KV, fold the output into the prompt, back to waiting."""
        rid = r.sched.request_id
        self.alloc.free(rid)
        del self.running[rid]
        r.fold()
        r.preemptions += 1
        self.preemptions += 1
        self._enqueue(r, now)

    def _fail_stuck(self, scheds_w: list[SchedRequest], pool: PoolView) -> None:
        for s in stuck_requests(scheds_w, [], pool):
            r = self.requests.pop(s.request_id)
            del self.waiting[s.request_id]
            need = pool.blocks_for(s.model, s.prompt_tokens + 1)
            usable = self.alloc.num_blocks - self.watermark_blocks
            self.failed.append(
                (
                    r,
                    f"prompt of {s.prompt_tokens} tokens needs {need} KV blocks; the pool has {usable} usable",
                )
            )

    def drain_failed(self) -> list[tuple[CoreRequest, str]]:
        out, self.failed = self.failed, []
        return out

    # ---------------------------------------------------------------------------- fast-forward
    def kv_bound(self, members: Sequence[CoreRequest], k_max: int) -> int:
        """Largest k ≤ k_max such that k − 1 more tokens per member fit the free blocks."""
        free = self.alloc.free_blocks
        ids = [r.sched.request_id for r in members]

        def fits(k: int) -> bool:
            return self.alloc.blocks_needed_to_grow_each(ids, k - 1) <= free

        if fits(k_max):
            return k_max
        lo, hi = 1, k_max  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def may_chunk(self, plan: StepPlan) -> bool:
        """Whether ``plan`` can repeat as a chunk: a pure-decode plan of a chunkable policy that ran
        exactly as the policy chose it (no prefill, no preemption, no member dropped)."""
        return (
            self.chunkable
            and not plan.static
            and not plan.prefills
            and not plan.preempted
            and len(plan.members) == len(plan.batch.request_ids)
        )

    def horizon(self, plan: StepPlan, now: float) -> float:
        """Until when the policy promises to choose ``plan``'s batch again (absent arrivals and
        finishes); ``now`` when it cannot be chunked (:meth:`may_chunk`)."""
        if not self.may_chunk(plan):
            return now
        return self.policy.stable_until(plan.batch, plan.waiting_seen, plan.running_seen, now)  # type: ignore[union-attr]

    # ---------------------------------------------------------------------------------- complete
    def complete(
        self,
        plan: StepPlan,
        now: float,
        durations: Sequence[float] | float,
        produced: Sequence[int] | None = None,
        finished: Iterable[CoreRequest] = (),
    ) -> StepResult:
        """Apply a step that ended at ``now``: the policy's ``on_iteration`` (or ``on_iterations`` for a
        chunk), each member's ``produced`` tokens (default ``plan.iterations``), the KV growth of a
        chunk, then ``finished`` members leave (``on_finish``, KV freed) in member order."""
        if plan is not self._plan:
            raise RuntimeError("complete() takes the plan in flight")
        self._plan = None
        for rid in self._deferred:
            if rid in self.alloc:
                self.alloc.free(rid)
        self._deferred.clear()
        if plan.static:
            return self._complete_static(plan, now, durations, produced, finished)
        k = plan.iterations
        members = plan.members
        scheds = [r.sched for r in members]
        if isinstance(durations, float | int):
            self.policy.on_iteration(plan.batch, float(durations), now, scheds)  # type: ignore[arg-type]
        elif k > 1 and self.run_charged:
            self.policy.on_iterations(plan.batch, durations, now, scheds)  # type: ignore[union-attr]
        else:
            self.policy.on_iteration(plan.batch, float(sum(durations)), now, scheds)  # type: ignore[arg-type]
        requests = self.requests
        if k > 1:
            self.alloc.grow_each([s.request_id for s in scheds if s.request_id in requests], k - 1)
        if produced is None:
            for r in members:
                r.produced += k
                r.sched.generated += k
        else:
            for r, n in zip(members, produced, strict=True):
                r.produced += n
                r.sched.generated += n
        done = []
        for r in finished:
            rid = r.sched.request_id
            if requests.pop(rid, None) is None:
                continue  # dropped while in flight
            self.running.pop(rid, None)
            if rid in self.alloc:
                self.alloc.free(rid)
            self.policy.on_finish(r.sched, now)
            done.append(r)
        return StepResult(done, [], [])
