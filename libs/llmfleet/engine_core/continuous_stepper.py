"""The engine core's continuous stepper: a :class:`~llmfleet.policies.request.RequestPolicy` picks each
iteration's batch (see :mod:`llmfleet.engine_core.core`).

A prefill takes ``sched.prompt_tokens`` tokens of KV, the first ones cached blocks of its prompt's
prefix when the pool holds them (:meth:`EngineCore.cached_prefix`), and computes the rest; a decode appends one slot (all members at once
when they fit, else one by one, preempting by recompute the victim the policy names). A plan whose
every member was preempted runs nothing: the policy is asked again.

A request naming a LoRA adapter takes its adapter slot as its prefill is admitted
(:meth:`EngineCore.take_adapter`) and stays waiting when none is free; it releases it when it finishes
or is preempted.

Before the policy is asked, the core's preemption rule may name running requests to preempt for the
first waiting request in its order (:meth:`EngineCore.preemption_victims`: a higher priority, or a
tenant below its fair share); they are preempted by the same recompute as a KV shortage and reported
in the next plan's ``preempted``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from llmfleet.engine_core.request import CoreRequest, StepEnd, StepPlan, StepResult
from llmfleet.engine_core.stepper import (
    SteppedCore,
    prefix_aware_policy,
    request_policy,
    run_charged_policy,
)
from llmfleet.kvblocks import OutOfBlocks
from llmfleet.policies.batching.base import StaticBatch
from llmfleet.policies.request.base import Batch


class ContinuousStepper:
    """Continuous batching: a new batch every iteration, preemption by recompute when KV runs out."""

    static = False

    def __init__(self) -> None:
        self._preempted: list[CoreRequest] = []  # preempted for a waiting request, not in a plan yet

    @property
    def batch(self) -> StaticBatch | None:
        return None

    def dropped(self, r: CoreRequest) -> None:
        if r in self._preempted:
            self._preempted.remove(r)

    def schedule(self, core: SteppedCore, now: float) -> StepPlan | None:
        while True:
            before = (core.preemptions, len(core.waiting))
            plan = self._schedule_once(core, now)
            if plan is not None or (core.preemptions, len(core.waiting)) == before:
                return plan

    def _schedule_once(self, core: SteppedCore, now: float) -> StepPlan | None:
        victims = core.preemption_victims(now)
        if victims:
            for victim in victims:
                self._preempt(core, victim, now)
                self._preempted.append(victim)
            core.take_claimed_slot()
        ws, rs = core.visible()
        scheds_w = [r.sched for r in ws]
        scheds_r = [r.sched for r in rs]
        pool = core.pool_view()
        if core.prefix_aware and ws:
            aware = prefix_aware_policy(core)
            refresh = aware.prefix_refresh
            aware.on_cached(
                {r.sched.request_id: core.cached_tokens(r, refresh) for r in ws[: aware.prefix_lookahead]}
            )
        batch = request_policy(core).next_batch(scheds_w, scheds_r, pool, core.batch_limits, now)
        if batch is None:
            if not rs and not core.paused_count:
                core.fail_stuck(scheds_w, pool)
            return None
        ids = batch.request_ids
        reqs: list[CoreRequest]
        if batch.phase == "decode":  # the common case: one slot each, in one all-or-nothing step
            running = core.running
            try:
                reqs = [running[rid] for rid in ids]
            except KeyError:
                reqs = self._resolve(core, ids)
            try:
                core.alloc.grow_each(list(ids), 1)
            except OutOfBlocks:
                pass  # some decode needs a block that is not there: the per-request path preempts
            else:
                ctx = sum([r.sched.prompt_tokens + r.sched.generated for r in reqs])
                ahead = self._take_preempted()
                return StepPlan(batch, batch.model, reqs, [], ahead, 0, 0, len(reqs), ctx, scheds_w, scheds_r)
        else:
            reqs = self._resolve(core, ids)
        members: list[CoreRequest] = []
        prefills: list[CoreRequest] = []
        preempted: list[CoreRequest] = self._preempted
        prefill = prefill_sq = decodes = ctx = cached_total = 0
        for r in reqs:
            s = r.sched
            rid = s.request_id
            if s.phase == "prefill":
                if not core.take_adapter(r):
                    continue  # every slot is held by other adapters' requests (or it failed): it waits
                hit = core.cached_prefix(r)
                try:
                    core.alloc.reserve(rid, s.model, s.prompt_tokens, hit)
                except OutOfBlocks:
                    core.release_adapter(r)
                    continue  # the policy over-admitted; it retries next iteration
                core.waiting.pop(rid)
                core.running[rid] = r
                s.phase = "decode"
                cached = r.cached = len(hit) * core.alloc.tokens_per_block(s.model) if hit else 0
                core.note_prefix(s.prompt_tokens, cached)
                n = s.prompt_tokens - cached
                prefill += n
                prefill_sq += n * (n + 2 * cached)
                cached_total += cached
                prefills.append(r)
            else:
                if not self._append_or_preempt(core, r, members, preempted, now):
                    continue
                decodes += 1
                ctx += s.context_tokens
            members.append(r)
        if not members:
            return None
        self._preempted = []
        return StepPlan(
            batch, batch.model, members, prefills, preempted, prefill, prefill_sq, decodes, ctx,
            scheds_w, scheds_r, cached_tokens=cached_total,
        )  # fmt: skip

    def _take_preempted(self) -> list[CoreRequest]:
        out, self._preempted = self._preempted, []
        return out

    @staticmethod
    def _resolve(core: SteppedCore, ids: Sequence[str]) -> list[CoreRequest]:
        out = []
        for rid in ids:
            r = core.waiting.get(rid) or core.running.get(rid)
            if r is None or r.paused:
                raise RuntimeError(f"policy {core.policy.name} batched unknown request {rid!r}")
            out.append(r)
        return out

    def _append_or_preempt(
        self,
        core: SteppedCore,
        r: CoreRequest,
        members: list[CoreRequest],
        preempted: list[CoreRequest],
        now: float,
    ) -> bool:
        while True:
            try:
                core.alloc.append_slot(r.sched.request_id)
                return True
            except OutOfBlocks:
                cands = [x for x in core.running.values() if x is not r and not x.paused and x not in members]
                by_id = {id(x.sched): x for x in [*cands, r]}
                victim = by_id[
                    id(request_policy(core).preemption_victim([x.sched for x in [*cands, r]], now))
                ]
                self._preempt(core, victim, now)
                preempted.append(victim)
                if victim is r:
                    return False

    @staticmethod
    def _preempt(core: SteppedCore, r: CoreRequest, now: float) -> None:
        """Preemption by recompute: drop the KV, fold the output into the prompt, back to waiting."""
        rid = r.sched.request_id
        core.alloc.free(rid)
        del core.running[rid]
        core.release_adapter(r)  # acquired again when it is admitted again
        r.fold()
        r.preemptions += 1
        core.preemptions += 1
        core.enqueue(r, now)

    def complete(self, core: SteppedCore, plan: StepPlan, end: StepEnd) -> StepResult:
        now, durations, produced = end.now, end.durations, end.produced
        k = plan.iterations
        members = plan.members
        scheds = [r.sched for r in members]
        policy = request_policy(core)
        batch = cast(Batch, plan.batch)  # this stepper's plans carry the batch its policy chose
        if isinstance(durations, float | int):
            policy.on_iteration(batch, float(durations), now, scheds)
        elif k > 1 and core.run_charged:
            run_charged_policy(core).on_iterations(batch, durations, now, scheds)
        else:
            policy.on_iteration(batch, float(sum(durations)), now, scheds)
        requests = core.requests
        if k > 1:
            core.alloc.grow_each([s.request_id for s in scheds if s.request_id in requests], k - 1)
        if produced is None:
            for r in members:
                r.sched.generated += k
        else:
            for r, n in zip(members, produced, strict=True):
                r.sched.generated += n
        core.cache_filled(members, produced)
        done = []
        for r in end.finished:
            rid = r.sched.request_id
            if requests.pop(rid, None) is None:
                continue  # dropped while in flight
            core.running.pop(rid, None)
            if rid in core.alloc:
                core.alloc.free(rid)
            core.release_adapter(r)
            policy.on_finish(r.sched, now)
            done.append(r)
        return StepResult(done, [], [])
