"""The engine core's static stepper: a :class:`~llmfleet.policies.batching.StaticBatchPolicy` as HF
``generate`` runs it (see :mod:`llmfleet.engine_core.core`): ``form_batch`` when idle, rows padded to
the longest prompt, every row (finished ones as padding) one slot per iteration until all rows finished,
the slice's ``max_iterations`` ran or the pool cannot grow; at the batch end the unfinished rows are
re-queued to be re-prefilled with prompt + output so far. A row naming a LoRA adapter holds its adapter
slot from the batch's start to its end; one whose adapter finds no slot waits for a later batch."""

from __future__ import annotations

from dataclasses import replace

from llmfleet.engine_core.request import CoreRequest, StepEnd, StepPlan, StepResult
from llmfleet.engine_core.stepper import SteppedCore, static_policy
from llmfleet.kvblocks import OutOfBlocks
from llmfleet.policies.batching.base import StaticBatch


class StaticStepper:
    """Static batching with padded rows; holds the batch in progress."""

    static = True

    def __init__(self) -> None:
        self.batch: StaticBatch | None = None
        self.rows: list[CoreRequest] = []
        self.done: set[str] = set()  # rows finished (still padding until the batch ends)
        self.iterations = 0  # of the batch in progress
        self.duration_s = 0.0
        self.longest = 0  # the padded prompt length

    def dropped(self, r: CoreRequest) -> None:
        if self.batch is not None:
            self.rows = [x for x in self.rows if x is not r]
            self.done.discard(r.sched.request_id)

    def schedule(self, core: SteppedCore, now: float) -> StepPlan | None:
        if self.batch is not None:
            plan = self._decode(core, self.batch)
            if plan is not None:
                return plan
            self._end(core, now)  # the pool cannot grow: an OOM slice end
        ws, _ = core.visible()
        scheds_w = [r.sched for r in ws]
        pool = core.pool_view()
        sb = static_policy(core).form_batch(scheds_w, pool, core.batch_limits, now)
        if sb is None:
            if not core.running and not core.paused_count:
                core.fail_stuck(scheds_w, pool)
            return None
        rows = [r for r in (core.waiting[rid] for rid in sb.request_ids) if core.take_adapter(r)]
        if len(rows) < len(sb.request_ids):  # rows whose adapter finds no slot wait for a later batch
            if not rows:
                return None
            sb = replace(sb, request_ids=tuple(r.sched.request_id for r in rows))
        longest = max(r.sched.prompt_tokens for r in rows)
        for i, r in enumerate(rows):
            try:
                core.alloc.reserve(r.sched.request_id, sb.model, longest)
            except OutOfBlocks:
                for x in rows[:i]:
                    core.alloc.free(x.sched.request_id)
                for x in rows:
                    core.release_adapter(x)
                raise RuntimeError(
                    f"static policy {core.policy.name} formed a batch that does not fit the pool"
                ) from None
        for r in rows:
            core.waiting.pop(r.sched.request_id)
            core.running[r.sched.request_id] = r
            r.sched.phase = "decode"
        self.batch, self.rows, self.done, self.iterations, self.duration_s = sb, rows, set(), 0, 0.0
        self.longest = longest
        n = len(rows)
        return StepPlan(
            sb, sb.model, list(rows), list(rows), [], n * longest, n * longest * longest, 0, 0,
            scheds_w, [], static=True, rows=list(rows), padded_len=longest,
        )  # fmt: skip

    def _decode(self, core: SteppedCore, sb: StaticBatch) -> StepPlan | None:
        rows = self.rows
        try:
            core.alloc.grow_each([r.sched.request_id for r in rows], 1)
        except OutOfBlocks:
            return None
        n = len(rows)
        active = [r for r in rows if r.sched.request_id not in self.done]
        ctx = n * (self.longest + self.iterations)
        return StepPlan(
            sb, sb.model, active, [], [], 0, 0, n, ctx, [], [],
            static=True, rows=list(rows), padded_len=self.longest,
        )  # fmt: skip

    def steps_left(self, core: SteppedCore, plan: StepPlan, cap: int | None = None) -> int:
        """Iterations the static batch may run from ``plan`` on (``cap``, the slice limit and the KV)."""
        sb = self.batch
        assert plan.static and sb is not None
        left = max(r.sched.max_new_tokens - r.sched.generated for r in plan.rows)
        if cap is not None:
            left = min(left, cap)
        if sb.max_iterations is not None:
            left = min(left, sb.max_iterations - self.iterations)
        return core.kv_bound(plan.rows, max(1, left))

    def complete(self, core: SteppedCore, plan: StepPlan, end: StepEnd) -> StepResult:
        now, durations, produced = end.now, end.durations, end.produced
        k = plan.iterations
        dur = float(durations) if isinstance(durations, float | int) else float(sum(durations))
        self.iterations += k
        self.duration_s += dur
        requests = core.requests
        if k - 1 > plan.reserved:
            ids = [r.sched.request_id for r in plan.rows if r.sched.request_id in requests]
            core.alloc.grow_each(ids, k - 1 - plan.reserved)
        for i, r in enumerate(plan.members):
            n = k if produced is None else produced[i]
            r.sched.generated += n
        done = []
        for r in end.finished:
            rid = r.sched.request_id
            if rid in requests and rid not in self.done:
                self.done.add(rid)
                done.append(r)
        sb = self.batch
        rows_ids = [r.sched.request_id for r in self.rows]
        ended = sb is not None and (
            len(self.done) >= len(self.rows)
            or (sb.max_iterations is not None and self.iterations >= sb.max_iterations)
            or core.alloc.blocks_needed_to_grow_each(rows_ids, 1) > core.alloc.free_blocks  # OOM end
        )
        if not ended:
            return StepResult(done, [], [])
        rows = self.rows
        requeued = self._end(core, now)
        return StepResult(done, requeued, rows)

    def _end(self, core: SteppedCore, now: float) -> list[CoreRequest]:
        """Batch end: every row frees its padded KV; finished rows leave, the others are re-queued."""
        sb, rows = self.batch, self.rows
        assert sb is not None
        self.batch, self.rows = None, []
        requeued = []
        for r in rows:
            rid = r.sched.request_id
            if rid in core.alloc:
                core.alloc.free(rid)
            core.running.pop(rid, None)
            core.release_adapter(r)
            if rid in self.done:
                core.requests.pop(rid, None)
            else:
                r.fold()
                core.enqueue(r, now)
                requeued.append(r)
                core.requeues += 1
        static_policy(core).on_batch_done(sb, self.duration_s, now, [r.sched for r in rows])
        self.done = set()
        return requeued
