"""The engine core's static mode: a :class:`~llmfleet.policies.batching.StaticBatchPolicy` as HF
``generate`` runs it (see :mod:`llmfleet.engine_core.core`): ``form_batch`` when idle, rows padded to
the longest prompt, every row (finished ones as padding) one slot per iteration until all rows finished,
the slice's ``max_iterations`` ran or the pool cannot grow; at the batch end the unfinished rows are
re-queued to be re-prefilled with prompt + output so far."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from llmfleet.engine_core.request import CoreRequest, StepPlan, StepResult
from llmfleet.kvblocks import BlockAllocator, OutOfBlocks
from llmfleet.policies.batching.base import StaticBatch
from llmfleet.policies.request.base import BatchLimits, PoolView, SchedRequest


class StaticMode:
    """Mixin of :class:`~llmfleet.engine_core.core.EngineCore` (its static-batch state and steps)."""

    # EngineCore's state used here
    policy: object
    alloc: BlockAllocator
    batch_limits: BatchLimits
    requests: dict[str, CoreRequest]
    waiting: dict[str, CoreRequest]
    running: dict[str, CoreRequest]
    requeues: int
    _paused: int
    _plan: StepPlan | None
    _sbatch: StaticBatch | None
    _srows: list[CoreRequest]
    _sdone: set[str]
    _siters: int
    _sdur: float
    _slongest: int

    if TYPE_CHECKING:  # provided by the class this is mixed into

        def _visible(self) -> tuple[list[CoreRequest], list[CoreRequest]]: ...

        def pool_view(self) -> PoolView: ...

        def _fail_stuck(self, scheds_w: list[SchedRequest], pool: PoolView) -> None: ...

        def _enqueue(self, r: CoreRequest, now: float) -> None: ...

        def kv_bound(self, members: Sequence[CoreRequest], k_max: int) -> int: ...

    def _schedule_static(self, now: float) -> StepPlan | None:
        if self._sbatch is not None:
            plan = self._static_decode()
            if plan is not None:
                return plan
            self._end_static(now)  # the pool cannot grow: an OOM slice end
        ws, _ = self._visible()
        scheds_w = [r.sched for r in ws]
        pool = self.pool_view()
        sb = self.policy.form_batch(scheds_w, pool, self.batch_limits, now)  # type: ignore[union-attr]
        if sb is None:
            if not self.running and not self._paused:
                self._fail_stuck(scheds_w, pool)
            return None
        rows = [self.waiting[rid] for rid in sb.request_ids]
        longest = max(r.sched.prompt_tokens for r in rows)
        for i, r in enumerate(rows):
            try:
                self.alloc.reserve(r.sched.request_id, sb.model, longest)
            except OutOfBlocks:
                for x in rows[:i]:
                    self.alloc.free(x.sched.request_id)
                raise RuntimeError(
                    f"static policy {self.policy.name} formed a batch that does not fit the pool"
                ) from None
        for r in rows:
            del self.waiting[r.sched.request_id]
            self.running[r.sched.request_id] = r
            r.sched.phase = "decode"
        self._sbatch, self._srows, self._sdone, self._siters, self._sdur = sb, rows, set(), 0, 0.0
        self._slongest = longest
        n = len(rows)
        return StepPlan(
            sb, sb.model, list(rows), list(rows), [], n * longest, n * longest * longest, 0, 0,
            scheds_w, [], static=True, rows=list(rows), padded_len=longest,
        )  # fmt: skip

    def _static_decode(self) -> StepPlan | None:
        rows = self._srows
        try:
            self.alloc.grow_each([r.sched.request_id for r in rows], 1)
        except OutOfBlocks:
            return None
        n = len(rows)
        active = [r for r in rows if r.sched.request_id not in self._sdone]
        ctx = n * (self._slongest + self._siters)
        return StepPlan(
            self._sbatch, self._sbatch.model, active, [], [], 0, 0, n, ctx, [], [],  # type: ignore[arg-type]
            static=True, rows=list(rows), padded_len=self._slongest,
        )  # fmt: skip

    def static_steps_left(self, plan: StepPlan, cap: int | None = None) -> int:
        """Iterations the static batch may run from ``plan`` on (``cap``, the slice limit and the
        KV): a simulator may set ``plan.iterations`` up to this, every row growing a slot per extra
        iteration."""
        sb = self._sbatch
        assert plan.static and sb is not None
        left = max(r.sched.max_new_tokens - r.sched.generated for r in plan.rows)
        if cap is not None:
            left = min(left, cap)
        if sb.max_iterations is not None:
            left = min(left, sb.max_iterations - self._siters)
        return self.kv_bound(plan.rows, max(1, left))

    def reserve_ahead(self, plan: StepPlan, k: int) -> None:
        """Run the static ``plan`` for ``k`` iterations, every row's padded KV for all of them reserved
        now (HF's static cache); ``k`` within :meth:`static_steps_left`."""
        if not plan.static or plan is not self._plan or k < 1:
            raise ValueError("reserve_ahead takes the static plan in flight and k >= 1")
        if k > 1:
            self.alloc.grow_each([r.sched.request_id for r in plan.rows], k - 1)
        plan.iterations = k
        plan.reserved = k - 1

    def _complete_static(
        self,
        plan: StepPlan,
        now: float,
        durations: Sequence[float] | float,
        produced: Sequence[int] | None,
        finished: Iterable[CoreRequest],
    ) -> StepResult:
        k = plan.iterations
        dur = float(durations) if isinstance(durations, float | int) else float(sum(durations))
        self._siters += k
        self._sdur += dur
        requests = self.requests
        if k - 1 > plan.reserved:
            ids = [r.sched.request_id for r in plan.rows if r.sched.request_id in requests]
            self.alloc.grow_each(ids, k - 1 - plan.reserved)
        for i, r in enumerate(plan.members):
            n = k if produced is None else produced[i]
            r.produced += n
            r.sched.generated += n
        done = []
        for r in finished:
            rid = r.sched.request_id
            if rid in requests and rid not in self._sdone:
                self._sdone.add(rid)
                done.append(r)
        sb = self._sbatch
        rows_ids = [r.sched.request_id for r in self._srows]
        ended = sb is not None and (
            len(self._sdone) >= len(self._srows)
            or (sb.max_iterations is not None and self._siters >= sb.max_iterations)
            or self.alloc.blocks_needed_to_grow_each(rows_ids, 1) > self.alloc.free_blocks  # OOM end
        )
        if not ended:
            return StepResult(done, [], [])
        rows = self._srows
        requeued = self._end_static(now)
        return StepResult(done, requeued, rows)

    def _end_static(self, now: float) -> list[CoreRequest]:
        """Batch end: every row frees its padded KV; finished rows leave, the others are re-queued."""
        sb, rows = self._sbatch, self._srows
        assert sb is not None
        self._sbatch, self._srows = None, []
        requeued = []
        for r in rows:
            rid = r.sched.request_id
            if rid in self.alloc:
                self.alloc.free(rid)
            self.running.pop(rid, None)
            if rid in self._sdone:
                self.requests.pop(rid, None)
            else:
                r.fold()
                self._enqueue(r, now)
                requeued.append(r)
                self.requeues += 1
        self.policy.on_batch_done(sb, self._sdur, now, [r.sched for r in rows])  # type: ignore[union-attr]
        self._sdone = set()
        return requeued
