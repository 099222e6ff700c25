"""One simulated engine instance: the live engine's iteration loop with time from the cost model.

It mirrors ``llmfleet_engine.executor`` step for step: the request policy object picks each batch
(waiting requests beyond ``max_requests − running`` are not shown to it), a prefill allocates its prompt
in the real :class:`~llmfleet.kvblocks.BlockAllocator`, a decode appends one slot and preempts by
recompute (the policy names the victim) when the pool is full, a finished request frees its blocks.

Fast-forward (exact): when a pure-decode batch is chosen and the policy promises, through an optional
``stable_until(batch, waiting, running, now) -> float``, that it would choose the same batch at every
iteration boundary before that time (absent arrivals and finishes), the instance runs up to the first
finish as one *chunk* and reports it to the policy with the summed duration. An arrival truncates the
chunk to the iteration in progress, so the policy sees it at the same boundary as without chunking.

Static mode (a :class:`~llmfleet.policies.batching.StaticBatchPolicy`): a batch is padded to its
longest prompt and decodes all rows until the longest output or ``max_iterations``; the whole batch
is one event. ``static_release="batch_end"`` (HF ``generate``) delivers outputs when the batch ends,
``"eos"`` when each row finishes. Unfinished rows at a slice end return to waiting (recompute).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

import numpy as np
from llmfleet.costmodel import Hardware, ModelArch
from llmfleet.kvblocks import BlockAllocator, OutOfBlocks
from llmfleet.policies.batching import StaticBatch, StaticBatchPolicy
from llmfleet.policies.request import (
    Batch,
    BatchLimits,
    PoolView,
    RequestPolicy,
    SchedRequest,
    stuck_requests,
)
from llmfleet.sim.cost import CostBook
from llmfleet.sim.memory import pool_layout
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.spec import EngineSettings


class _Req:
    __slots__ = ("cap", "prompt", "rec", "sched")

    def __init__(self, sched: SchedRequest, rec: RequestRecord, cap: int) -> None:
        self.sched = sched
        self.rec = rec
        self.prompt = rec.prompt_tokens
        self.cap = cap

    @property
    def remaining(self) -> int:
        return self.rec.output_tokens - self.rec.produced


@dataclass(slots=True)
class _Work:
    """The batch in flight: ``k`` iterations from ``start`` to ``end``. A chunk (k > 1) or a static
    batch keeps every iteration's bounds in ``starts``/``ends`` (``end == ends[k-1]``)."""

    batch: Batch | StaticBatch
    members: list[_Req]
    start: float
    end: float
    k: int
    starts: np.ndarray | None = None
    ends: np.ndarray | None = None
    static: bool = False
    rows_done_at: dict[str, float] | None = None  # static: when each finished row produced its EOS

    @property
    def first_end(self) -> float:
        """End of the first iteration (when a prefill's first token appears)."""
        return self.end if self.ends is None else float(self.ends[0])


class SimInstance:
    def __init__(
        self,
        instance_id: str,
        models: tuple[str, ...],
        tp: int,
        hw: Hardware,
        archs: dict[str, ModelArch],
        engine: EngineSettings,
        cost: CostBook,
        policy: RequestPolicy | StaticBatchPolicy,
        fast_forward: bool = True,
    ) -> None:
        self.instance_id = instance_id
        self.models = models
        self.tp = tp
        self.engine = engine
        self.cost = cost
        self.policy = policy
        self.static = isinstance(policy, StaticBatchPolicy) and not isinstance(policy, RequestPolicy)
        self.layout = pool_layout(hw, tp, [archs[m] for m in models], engine)
        self.alloc = BlockAllocator(self.layout.num_blocks, self.layout.block_bytes, engine.watermark)
        for m in models:
            self.alloc.register_model(m, archs[m].kv_shape)
        self.tpb = {m: self.alloc.tokens_per_block(m) for m in models}
        self._lm = {m: cost.model(m, tp) for m in models}  # this instance's latency model per model
        self._pool: PoolView | None = None  # the last view handed out (reused while free blocks match)
        self.limits = BatchLimits(engine.max_requests, engine.max_prefill_tokens)
        self.waiting: dict[str, _Req] = {}
        self.running: dict[str, _Req] = {}
        self.work: _Work | None = None
        self.version = 0
        self.fast_forward = fast_forward and hasattr(policy, "stable_until")
        self.iterations = 0
        self.busy_s = 0.0
        self.preemptions = 0

    # ------------------------------------------------------------------------------------ load view
    @property
    def queued(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def kv_capacity_bytes(self) -> int:
        return self.layout.num_blocks * self.layout.block_bytes

    @property
    def kv_used_bytes(self) -> int:
        return self.alloc.used_blocks * self.layout.block_bytes

    def pool_view(self) -> PoolView:
        pool = self._pool
        free = self.alloc.free_blocks
        if pool is None or pool.free_blocks != free:
            pool = self._pool = PoolView(free, self.alloc.watermark_blocks, self.tpb)
        return pool

    # ------------------------------------------------------------------------------------- requests
    def admit(
        self,
        rec: RequestRecord,
        cap: int,
        now: float,
        predicted: float | None = None,
        deadline: float | None = None,
    ) -> None:
        """A request dispatched here at ``now`` (call :meth:`interrupt` afterwards if busy)."""
        if rec.model not in self.tpb:
            raise ValueError(f"instance {self.instance_id} does not host model {rec.model!r}")
        sched = SchedRequest(
            rec.request_id,
            rec.service,
            rec.model,
            now,
            rec.prompt_tokens,
            max(cap, rec.output_tokens),
            predicted_output_tokens=predicted,
            deadline_s=deadline,
        )
        self._enqueue(_Req(sched, rec, cap), now)

    def _enqueue(self, r: _Req, now: float) -> None:
        r.sched.phase = "prefill"
        self.waiting[r.sched.request_id] = r
        self.policy.on_arrival(r.sched, now)

    def interrupt(self, now: float) -> float | None:
        """Something changed at ``now`` while a chunk is in flight: cut the chunk to the iteration in
        progress. Returns the new end time if it moved (the caller reschedules), else None."""
        w = self.work
        if w is None or w.static or w.k == 1 or w.starts is None or w.ends is None:
            return None
        k = max(1, int(np.searchsorted(w.starts[: w.k], now, side="left")))
        if k == w.k:
            return None
        w.k = k
        w.end = float(w.ends[k - 1])
        self.version += 1
        return w.end

    # ------------------------------------------------------------------------------------ iterations
    def start(self, now: float, fail: Callable[[_Req, str], None]) -> float | None:
        """Pick and launch the next batch at ``now``; its end time, or None when idle.

        A batch whose every member was preempted (each decode named itself the victim) launches
        nothing; the policy is asked again, as the live engine's loop does, until a batch runs or
        nothing changes."""
        assert self.work is None, "an iteration is already in flight"
        if self.static:
            return self._start_static(now, fail)
        while True:
            before = (self.preemptions, len(self.waiting))
            end = self._start_continuous(now, fail)
            if end is not None or (self.preemptions, len(self.waiting)) == before:
                return end

    def _start_continuous(self, now: float, fail: Callable[[_Req, str], None]) -> float | None:
        running, waiting = self.running, self.waiting
        room = self.limits.max_requests - len(running)
        scheds_r = [r.sched for r in running.values()]
        if len(waiting) <= room:
            scheds_w = [r.sched for r in waiting.values()]
        else:
            scheds_w = [r.sched for r in islice(waiting.values(), max(0, room))]
        pool = self.pool_view()
        batch = self.policy.next_batch(scheds_w, scheds_r, pool, self.limits, now)
        if batch is None:
            if not running:
                for s in stuck_requests(scheds_w, scheds_r, pool):
                    fail(waiting.pop(s.request_id), self._too_big(s))
            return None
        members: list[_Req] = []
        prefill = prefill_sq = decodes = ctx = 0
        preemptions_before = self.preemptions
        ids = batch.request_ids
        if batch.phase == "decode":  # the common case: one slot each, in one all-or-nothing step
            try:
                reqs = [running[rid] for rid in ids]
            except KeyError:
                reqs = self._resolve(ids)
            try:
                self.alloc.grow_each(list(ids), 1)
            except OutOfBlocks:
                pass  # some decode needs a block that is not there: the per-request path preempts
            else:
                members = reqs
                decodes = len(reqs)
                ctx = sum([r.sched.prompt_tokens + r.sched.generated for r in reqs])
                reqs = []
        else:
            reqs = self._resolve(ids)
        for r in reqs:
            rid = r.sched.request_id
            if r.sched.phase == "prefill":
                try:
                    self.alloc.reserve(rid, r.sched.model, r.sched.prompt_tokens)
                except OutOfBlocks:
                    continue  # the policy over-admitted; it retries next iteration
                del self.waiting[rid]
                self.running[rid] = r
                r.sched.phase = "decode"
                prefill += r.sched.prompt_tokens
                prefill_sq += r.sched.prompt_tokens * r.sched.prompt_tokens
            else:
                if not self._append_or_preempt(r, members, now):
                    continue
                decodes += 1
                ctx += r.sched.context_tokens
            members.append(r)
        if not members:
            return None
        preempted = self.preemptions != preemptions_before
        lm = self._lm[batch.model]
        dur = lm.iteration(prefill, prefill_sq, decodes, ctx)
        work = None
        if self.fast_forward and prefill == 0 and len(members) == len(batch.request_ids) and not preempted:
            # (a preemption or a failed allocation changed the queues the policy looked at: no chunk)
            work = self._chunk(batch, members, dur, decodes, ctx, scheds_w, scheds_r, now)
        self.work = work or _Work(batch, members, now, now + dur, 1)
        self.version += 1
        return self.work.end

    def _resolve(self, ids: tuple[str, ...]) -> list[_Req]:
        out = []
        for rid in ids:
            r = self.waiting.get(rid) or self.running.get(rid)
            if r is None:
                raise RuntimeError(f"policy {self.policy.name} batched unknown request {rid!r}")
            out.append(r)
        return out

    def _too_big(self, s: SchedRequest) -> str:
        need = self.pool_view().blocks_for(s.model, s.prompt_tokens + 1)
        return (
            f"prompt of {s.prompt_tokens} tokens needs {need} KV blocks; instance {self.instance_id} has "
            f"{self.alloc.num_blocks - self.alloc.watermark_blocks} usable"
        )

    def _append_or_preempt(self, r: _Req, members: list[_Req], now: float) -> bool:
        while True:
            try:
                self.alloc.append_slot(r.sched.request_id)
                return True
            except OutOfBlocks:
                cands = [x for x in self.running.values() if x is not r and x not in members]
                by_id = {id(x.sched): x for x in [*cands, r]}
                victim = by_id[id(self.policy.preemption_victim([x.sched for x in [*cands, r]], now))]
                self._preempt(victim, now)
                if victim is r:
                    return False

    def _preempt(self, r: _Req, now: float) -> None:
        rid = r.sched.request_id
        self.alloc.free(rid)
        del self.running[rid]
        r.sched.prompt_tokens = r.prompt + r.rec.produced
        r.sched.max_new_tokens = max(1, r.sched.max_new_tokens - r.sched.generated)
        r.sched.generated = 0
        r.rec.preemptions += 1
        self.preemptions += 1
        self._enqueue(r, now)

    def _chunk(self, batch, members, dur, n, ctx, scheds_w, scheds_r, now) -> _Work | None:
        """Grow a pure-decode iteration of ``dur`` into a chunk, or None when it stays one iteration.

        Bounds are one ``cumsum`` over [now, dur, d_2, …], the same additions as a running ``t += d``,
        so every iteration ends exactly where iterating one by one would put it."""
        k_max = min([r.rec.output_tokens - r.rec.produced for r in members])
        if k_max <= 1:
            return None
        horizon = self.policy.stable_until(batch, scheds_w, scheds_r, now)  # type: ignore[union-attr]
        if horizon <= now + dur:
            return None
        k_max = self._kv_bound(members, k_max)
        if k_max <= 1:
            return None
        steps = np.empty(k_max + 1)
        steps[0] = now
        steps[1] = dur
        self._lm[batch.model].decode_steps_into(steps[2:], n, ctx + n, n)
        bounds = np.cumsum(steps)
        k = k_max
        if horizon != np.inf:  # iterations starting before the horizon
            k = max(1, int(np.searchsorted(bounds[:-1], horizon, side="left")))
        if k == 1:
            return None
        return _Work(batch, members, now, float(bounds[k]), k, bounds[:k], bounds[1 : k + 1])

    def _kv_bound(self, members: list[_Req], k_max: int) -> int:
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

    def finish_work(self, now: float) -> list[_Req]:
        """Apply the in-flight batch's effects at its end ``now``; the requests that completed."""
        w = self.work
        assert w is not None
        self.work = None
        if w.static:
            return self._finish_static(w, now)
        k = w.k
        dur = w.end - w.start
        self.iterations += k
        self.busy_s += dur
        scheds = [r.sched for r in w.members]
        if k > 1 and w.ends is not None and hasattr(self.policy, "on_iterations"):
            self.policy.on_iterations(w.batch, np.diff(w.ends[:k], prepend=w.start), now, scheds)
        else:
            self.policy.on_iteration(w.batch, dur, now, scheds)
        done: list[_Req] = []
        if k > 1:
            self.alloc.grow_each([s.request_id for s in scheds], k - 1)
        first_end = None
        for r in w.members:
            rec = r.rec
            rec.produced += k
            r.sched.generated += k
            if rec.first_token_s is None:
                rec.first_token_s = first_end = w.first_end if first_end is None else first_end
            if rec.produced >= rec.output_tokens:
                self._complete(r, now)
                done.append(r)
        return done

    def _complete(self, r: _Req, now: float) -> None:
        rid = r.sched.request_id
        self.alloc.free(rid)
        self.running.pop(rid, None)
        r.rec.finish_s = now
        self.policy.on_finish(r.sched, now)

    # ----------------------------------------------------------------------------- static batching
    def _start_static(self, now: float, fail: Callable[[_Req, str], None]) -> float | None:
        waiting = list(self.waiting.values())
        pool = self.pool_view()
        batch = self.policy.form_batch([r.sched for r in waiting], pool, self.limits, now)  # type: ignore[union-attr]
        if batch is None:
            for s in stuck_requests([r.sched for r in waiting], [], pool):
                fail(self.waiting.pop(s.request_id), self._too_big(s))
            return None
        members = [self.waiting[rid] for rid in batch.request_ids]
        n = len(members)
        longest = max(r.sched.prompt_tokens for r in members)
        for i, r in enumerate(members):
            try:
                self.alloc.allocate(r.sched.request_id, batch.model, longest)
            except OutOfBlocks:
                for x in members[:i]:
                    self.alloc.free(x.sched.request_id)
                raise RuntimeError(
                    f"static policy {self.policy.name} formed a batch that does not fit the pool"
                ) from None
        for r in members:
            del self.waiting[r.sched.request_id]
            self.running[r.sched.request_id] = r
            r.sched.phase = "decode"
        # iterations: the prefill yields token 1, each decode step one more, until the longest output
        steps = max(r.remaining for r in members)
        if batch.max_iterations is not None:
            steps = min(steps, batch.max_iterations)
        steps = min(steps, self._kv_bound(members, steps))
        if steps > 1:  # the padded cache for every step is reserved up front (HF's static cache)
            for r in members:
                self.alloc.grow(r.sched.request_id, steps - 1)
        lm = self.cost.model(batch.model, self.tp)
        durs = np.concatenate(([now + lm.prefill(n * longest, n * longest * longest)],
                               lm.decode_steps(n, n * (longest + 1), n, steps - 1)))  # fmt: skip
        ends = np.cumsum(durs)
        starts = np.concatenate(([now], ends[:-1]))
        rows_done = {
            r.sched.request_id: float(ends[r.remaining - 1]) for r in members if r.remaining <= steps
        }
        self.work = _Work(
            batch, members, now, float(ends[-1]), steps, starts, ends, static=True, rows_done_at=rows_done
        )
        self.version += 1
        return self.work.end

    def _finish_static(self, w: _Work, now: float) -> list[_Req]:
        k = w.k
        self.iterations += k
        self.busy_s += now - w.start
        self.policy.on_batch_done(w.batch, now - w.start, now, [r.sched for r in w.members])  # type: ignore[union-attr, arg-type]
        eos = self.engine.static_release == "eos"
        done: list[_Req] = []
        for r in w.members:
            rid = r.sched.request_id
            if r.rec.first_token_s is None:
                r.rec.first_token_s = w.first_end if eos else now
            self.alloc.free(rid)
            del self.running[rid]
            finished_at = w.rows_done_at.get(rid) if w.rows_done_at else None
            if finished_at is not None:
                r.rec.produced = r.rec.output_tokens
                r.rec.finish_s = finished_at if eos else now
                done.append(r)
            else:  # slice end or KV exhausted: back to waiting, recompute prompt + output so far
                r.rec.produced += k
                r.sched.prompt_tokens = r.prompt + r.rec.produced
                r.sched.max_new_tokens = max(1, r.sched.max_new_tokens - k)
                r.sched.generated = 0
                self._enqueue(r, now)
        return done
