"""The engine core: one pure object that runs an engine's request table, queues, KV blocks and policy.

Shaped like vLLM V1's scheduler (schedule → execute → update): the driver calls ``schedule(now)`` for
a :class:`StepPlan`, executes it (the live executor: a forward pass and sampling; the simulator: the
cost model's time), then ``complete(plan, now, ...)`` applies its effects. No threads, no I/O, no clock
reads: both the live engine and the simulator drive the very same object, so their batch sequences,
preemptions and finish orders are the same by construction (``libs/tests/engine_core/test_parity.py``).

Two steppers (:mod:`llmfleet.engine_core.stepper`), one chosen when the core is built (by default by
the policy's type, :func:`stepper_for`); the core holds the request table and the step in flight, the
stepper chooses each step and applies its effects:

* **continuous** (:class:`~llmfleet.engine_core.continuous_stepper.ContinuousStepper`) — a
  :class:`~llmfleet.policies.request.RequestPolicy` (FCFS, SeaLLM's doubling budget, MuxServe RR, or
  a static batcher kept over continuous batching by ``StaticBatches``) picks each iteration's batch.
  A prefill takes ``sched.prompt_tokens`` tokens of KV, starting on the cached blocks of its prompt's
  prefix (prefix caching) and computing the rest; a decode appends one slot (all members at once
  when they fit, else one by one, preempting by recompute the victim the policy names). A plan whose
  every member was preempted runs nothing: the policy is asked again.
* **static** (:class:`~llmfleet.engine_core.static_stepper.StaticStepper`) — a
  :class:`~llmfleet.policies.batching.StaticBatchPolicy` (static SLS, SCLS, UELLM, S³) as HF
  ``generate`` runs it: ``form_batch`` when idle, every row padded to the longest prompt, all rows
  (finished ones as padding) grow one slot per iteration until every row finished, the slice's
  ``max_iterations`` ran, or the pool cannot grow (an OOM slice end). At the batch end all rows free
  their KV and the unfinished go back to waiting to be re-prefilled with prompt + output so far.

Prefix caching (``limits.prefix_caching``, continuous stepper): a request with prompt token ids looks
up its prompt's block hash chain (:func:`llmfleet.kvblocks.prefix_block_hashes`) in the pool; its
prefill starts on the cached blocks found, at least one prompt token always computed (its logits
give the first token). Each block is named as soon as it is full (as vLLM does): its prompt's full
blocks once its prefill's step completed, and, when its output ids are known, each output block as
decoding fills it (:meth:`EngineCore.cache_filled`), so a request arriving while another with the
same prefix still decodes, or a conversation's next turn, which resends the answer, starts on them.
The same hit or miss sets ``StepPlan.prefill_tokens``, so the live engine's forward, the
emulated engine's priced step and the simulator's step all compute only the uncached tokens.

Preemption for priority and fairness (``preemption``, a
:class:`~llmfleet.policies.request.preemption.PreemptionRule`; continuous stepper): once a request with
a priority or a tenant entered, waiting requests are shown to the policy highest priority first, then
the tenant holding the fewest running requests less its credit (:attr:`EngineCore.credit`, a
:class:`~llmfleet.policies.request.slot_credit.SlotCredit` fed the running and waiting requests before
each step), then arrival; and before each step the first of them, when it cannot be admitted (no room
under ``max_running``, or not enough free blocks), may preempt running requests the rule names (a lower
priority; or, in its band, the tenant furthest above its fair share plus credit) through the same
preemption by recompute as a KV shortage (the victims are in the next plan's ``preempted``). Requests
that all carry priority 0 and no tenant never preempt, and their order is untouched.

LoRA adapters (``adapters``, an :class:`~llmfleet.engine_core.adapter_slots.AdapterGate`): a request
naming an adapter (``CoreRequest.adapter``) acquires a slot of its base's adapter pool when it is
admitted (its prefill, a static batch, a landing with its KV) and releases it when it leaves the running
set (finished, dropped, preempted, re-queued at a static batch's end). A waiting request whose adapter
finds every slot held by other adapters' running requests stays waiting and is not shown to the policy
until a slot frees, so later requests go ahead; one whose adapter cannot be served here any more
leaves as failed (:meth:`drain_failed`). Under the preemption rule's priority, such a request that is
first in rank order preempts the running requests of one other adapter when they all have a lower
priority (the fewest of them; the least recently used adapter among equals) and takes the freed slot
at once, keeping it while it waits for its prefill (fairness among tenants does not preempt for a
slot). The simulator, the emulated engines and the native engine all pass their adapter pools through this one rule.

The policy calling contract is the one in ``llmfleet.policies.request.base`` and
``llmfleet.policies.batching.base``; this module and its two steppers are its only implementation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import cast

from llmfleet.engine_core.adapter_slots import AdapterGate, AdapterUnavailable
from llmfleet.engine_core.continuous_stepper import ContinuousStepper
from llmfleet.engine_core.limits import EngineLimits
from llmfleet.engine_core.request import CoreRequest, StepEnd, StepPlan, StepResult
from llmfleet.engine_core.static_stepper import StaticStepper
from llmfleet.engine_core.stepper import (
    ChunkablePolicy,
    PrefixAwarePolicy,
    RunChargedPolicy,
    Stepper,
    chunkable_policy,
)
from llmfleet.engine_core.waiting import WaitingQueue
from llmfleet.kvblocks import BlockAllocator
from llmfleet.policies.batching.base import StaticBatch, StaticBatchPolicy
from llmfleet.policies.request.base import (
    Batch,
    PoolView,
    RequestPolicy,
    SchedRequest,
    admission_blocks,
    stuck_requests,
)
from llmfleet.policies.request.preemption import Claim, PreemptionRule
from llmfleet.policies.request.slot_credit import credit_for

DEFAULT_PREEMPTION = PreemptionRule()


def stepper_for(policy: object) -> Stepper:
    """The stepper ``policy`` runs under: static for a static batcher, else continuous."""
    static = isinstance(policy, StaticBatchPolicy) and not isinstance(policy, RequestPolicy)
    return StaticStepper() if static else ContinuousStepper()


class EngineCore:
    """An engine's scheduling state. ``allocator`` may hold other sequences (the live engine reserves
    model weights in it); ``watermark_blocks`` is what admissions leave free (settable); the policy's
    type chooses continuous or static stepping (:func:`stepper_for`); ``adapters``: the LoRA adapter
    rule (None: no request names an adapter)."""

    def __init__(
        self,
        policy: RequestPolicy | StaticBatchPolicy,
        allocator: BlockAllocator,
        limits: EngineLimits | None = None,
        watermark_blocks: int | None = None,
        preemption: PreemptionRule | None = DEFAULT_PREEMPTION,
        adapters: AdapterGate | None = None,
    ) -> None:
        self.policy = policy
        self.adapters = adapters
        self.preemption = preemption  # None: preempt only on a KV shortage
        self.credit = credit_for(preemption)  # the tenants' fairness credit (None: none)
        self._started = 0  # requests that took a slot since the credit's last observation
        self.stepper = stepper_for(policy)
        self.static = self.stepper.static
        self.chunkable = isinstance(policy, ChunkablePolicy)
        self.run_charged = isinstance(policy, RunChargedPolicy)
        self.prefix_aware = isinstance(policy, PrefixAwarePolicy)
        self.alloc = allocator
        self.limits = limits or EngineLimits()
        self.batch_limits = self.limits.batch
        self.watermark_blocks = allocator.watermark_blocks if watermark_blocks is None else watermark_blocks
        self.tpb: dict[str, int] = {}
        self.requests: dict[str, CoreRequest] = {}
        self.waiting = WaitingQueue()
        self.running: dict[str, CoreRequest] = {}
        self.failed: list[tuple[CoreRequest, str]] = []  # stuck requests, drained by the driver
        self.preemptions = 0
        self.prefix_caching = self.limits.prefix_caching
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache, and found there
        self.prefix_hits = 0
        self.requeues = 0  # static stepper: unfinished rows sent back to waiting at a batch end
        self._plan: StepPlan | None = None
        self._deferred: list[str] = []  # KV of dropped in-flight members, freed at complete
        self._pool: PoolView | None = None
        self._paused = 0
        # a request with a priority or a tenant entered (else every claim is alike: priority 0, no tenant)
        self.claims_differ = False
        self._ranked = False  # ... and the preemption rule ranks waiting requests
        self.slot_claimant: CoreRequest | None = None  # preempted for: takes its adapter slot at once

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
        self.enqueue(r, now)

    def _register(self, r: CoreRequest) -> str:
        rid = r.sched.request_id
        if rid in self.requests:
            raise ValueError(f"request {rid!r} is already in the engine")
        if r.sched.model not in self.tpb:
            raise ValueError(f"model {r.sched.model!r} is not served here; known: {sorted(self.tpb)}")
        self.requests[rid] = r
        if not self.claims_differ and (r.sched.request_priority or r.sched.tenant):
            self.claims_differ = True
            self._ranked = self.preemption is not None and not self.static
        return rid

    def enqueue(self, r: CoreRequest, now: float) -> None:
        """``r`` (registered) joins waiting as a prefill; the policy's ``on_arrival``."""
        s = r.sched
        s.phase = "prefill"
        self.waiting.add(r, -(-s.prompt_tokens // self.tpb[s.model]))
        self.policy.on_arrival(s, now)

    def land(self, r: CoreRequest, now: float, kv_tokens: int = 0, reserved: bool = False) -> bool:
        """A request migrated in. With ``kv_tokens`` (= its context − 1) its KV comes along: it joins
        running if the blocks are (``reserved``: the caller already reserved them) or can be allocated
        here; otherwise it re-prefills prompt + output so far. True when it landed with its KV."""
        rid = self._register(r)
        if (
            kv_tokens
            and (reserved or self.alloc.can_allocate(r.sched.model, kv_tokens))
            and self._land_adapter(r)
        ):
            if not reserved:
                self.alloc.reserve(rid, r.sched.model, kv_tokens)
            r.filled = 0  # its blocks here are named as its next step ends
            r.sched.phase = "decode"
            self.running[rid] = r
            self._started += 1
            self.policy.on_arrival(r.sched, now)
            return True
        if reserved and rid in self.alloc:
            self.alloc.free(rid)
        r.fold()
        self.enqueue(r, now)
        return False

    def _land_adapter(self, r: CoreRequest) -> bool:
        """A request landing with its KV takes its adapter now (False: it re-prefills instead)."""
        if r.adapter is None:
            return True
        assert self.adapters is not None, f"request {r.sched.request_id!r} names an adapter; LoRA is off"
        try:
            slot = self.adapters.acquire(r)
        except AdapterUnavailable:
            return False  # its admission fails it
        if slot is None:
            return False
        r.adapter_slot = slot
        return True

    # ---------------------------------------------------------------------------------- adapters
    def take_adapter(self, r: CoreRequest) -> bool:
        """``r`` (waiting) is being admitted: pin its adapter (True at once for a request of a base
        model). False: it stays waiting (every slot is held by other adapters' requests), or its
        adapter cannot be served here and it left the core as failed (:meth:`drain_failed`)."""
        if r.adapter is None or r.adapter_slot >= 0:
            return True
        gate = self.adapters
        if gate is None:
            raise ValueError(f"request {r.sched.request_id!r} names adapter {r.adapter!r}; LoRA is off here")
        try:
            slot = gate.acquire(r)
        except AdapterUnavailable as e:
            rid = r.sched.request_id
            self.requests.pop(rid, None)
            self.waiting.pop(rid)
            self.failed.append((r, str(e)))
            return False
        if slot is None:
            return False
        r.adapter_slot = slot
        return True

    def release_adapter(self, r: CoreRequest) -> None:
        """``r`` left the running set: the adapter slot it holds (if any) is released."""
        if r.adapter_slot >= 0:
            r.adapter_slot = -1
            assert self.adapters is not None
            self.adapters.release(r)

    def _admissible(self, r: CoreRequest) -> bool:
        """A waiting request the policy may see: unpaused, and its adapter (if any) has room now."""
        if r.paused:
            return False
        return r.adapter is None or self.adapters is None or self.adapters.room(r)

    def drop(self, request_id: str) -> CoreRequest | None:
        """Remove a request for good (cancelled, failed, migrated away): its KV is freed — after the
        step in flight if it is a member. No ``on_finish`` (the policy contract's cancel)."""
        r = self.requests.pop(request_id, None)
        if r is None:
            return None
        self.waiting.pop(request_id)
        self.running.pop(request_id, None)
        if r.paused:
            r.paused = False
            self._paused -= 1
        if self.in_flight(request_id):
            self._deferred.append(request_id)
        elif request_id in self.alloc:
            self.alloc.free(request_id)
        self.release_adapter(r)
        self.stepper.dropped(r)
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
        """Static stepper: the batch in progress (None between batches and with a continuous stepper)."""
        return self.stepper.batch

    @property
    def inflight(self) -> set[str]:
        """Ids of the step in flight (between ``schedule`` and ``complete``): their KV is being written."""
        plan = self._plan
        if plan is None:
            return set()
        return {r.sched.request_id for r in (plan.rows if plan.static else plan.members)}

    @property
    def paused_count(self) -> int:
        """Requests paused (queued, excluded from scheduling)."""
        return self._paused

    def has_work(self) -> bool:
        """Anything schedulable (unpaused) is queued."""
        return len(self.waiting) + len(self.running) > self._paused

    # ---------------------------------------------------------------------------------- schedule
    def schedule(self, now: float) -> StepPlan | None:
        """The next step, its KV slots set up; None when nothing can run now. A plan whose members
        were all preempted launches nothing and the policy is asked again."""
        if self._plan is not None:
            raise RuntimeError("a step is already in flight: complete() it first")
        plan = self.stepper.schedule(self, now)
        if plan is not None:
            self._plan = plan
            self._started += len(plan.prefills)
        return plan

    def visible(self) -> tuple[list[CoreRequest], list[CoreRequest]]:
        """What the policy may see: unpaused waiting requests (but those whose adapter finds no slot)
        up to the room left under ``max_running``, and the unpaused running ones."""
        waiting, running = self.waiting, self.running
        room = max(0, self.limits.max_running - len(running))
        if self._ranked:
            return self._ranked_waiting()[:room], [r for r in running.values() if not r.paused]
        if self.adapters is not None:  # a request waiting for an adapter slot is passed over
            w = list(islice(filter(self._admissible, waiting.values()), room))
            return w, [r for r in running.values() if not r.paused]
        if self._paused:
            w = [r for r in waiting.values() if not r.paused][:room]
            return w, [r for r in running.values() if not r.paused]
        if len(waiting) <= room:
            return list(waiting.values()), list(running.values())
        return list(islice(waiting.values(), room)), list(running.values())

    # ---------------------------------------------------------------------------- preemption
    @staticmethod
    def claim(r: CoreRequest) -> Claim:
        """``r`` as the preemption rule sees it."""
        s = r.sched
        return Claim(s.request_id, s.request_priority, s.tenant, s.arrival_s, r.preemptions)

    def _held(self) -> Counter[tuple[int, str]]:
        """Running requests per (priority, tenant)."""
        return Counter((r.sched.request_priority, r.sched.tenant) for r in self.running.values())

    def _ranked_waiting(self) -> list[CoreRequest]:
        """Unpaused waiting requests in the preemption rule's order (priority, fewest held less credit,
        arrival)."""
        rule = self.preemption
        assert rule is not None
        held = self._held()
        credit = self.credit.table if self.credit is not None else None
        return sorted(
            filter(self._admissible, self.waiting.values()),
            key=lambda r: rule.rank(self.claim(r), held, credit),
        )

    def preemption_victims(self, now: float) -> list[CoreRequest]:
        """Running requests to preempt so that the first waiting request in rank order, which cannot be
        admitted now (no room under ``max_running``, or its blocks above the watermark are not free),
        can be; empty when it can be admitted already, or when the rule names too few victims. The
        tenants' credit observes the running and waiting requests at ``now`` first."""
        rule = self.preemption
        if rule is None or not self._ranked:
            return []
        if self.credit is not None:
            self.credit.observe(
                now,
                self._held(),
                [(r.sched.request_priority, r.sched.tenant) for r in self.waiting.values()],
                self.limits.max_running,
                self._started,
            )
            self._started = 0
        if not self.waiting or not self.running:
            return []
        if self.adapters is not None:
            held = self._adapter_victims()
            if held:
                return held
        ranked = self._ranked_waiting()
        if not ranked:
            return []
        pool = self.pool_view()
        need = admission_blocks(pool, ranked[0].sched)
        room = self.limits.max_running - len(self.running)
        free = pool.available_blocks
        holders = {id(r): (r, self.claim(r)) for r in self.running.values() if not r.paused}
        waiting = [self.claim(r) for r in ranked]
        credit = self.credit.of(waiting[0].priority) if self.credit is not None else None
        out: list[CoreRequest] = []
        while room <= 0 or need > free:
            got = rule.victim(
                waiting[0], [c for _, c in holders.values()], self.limits.max_running, waiting, credit
            )
            if got is None:
                return []
            victim = next(r for r, c in holders.values() if c is got)
            del holders[id(victim)]
            out.append(victim)
            room += 1
            free += pool.blocks_for(victim.sched.model, self.alloc.own_tokens(victim.sched.request_id))
        return out

    def _adapter_victims(self) -> list[CoreRequest]:
        """When the first unpaused waiting request in rank order names an adapter that finds every slot
        of its base held by other adapters' running requests: the holders of one such adapter, all of
        a lower priority than it and still preemptible (the fewest, the least recently used adapter
        among equals), whose preemption frees a slot for it (:attr:`slot_claimant` names it until it
        takes the slot); empty otherwise."""
        rule, gate = self.preemption, self.adapters
        assert rule is not None and gate is not None
        if not rule.priority:
            return []
        held = self._held()
        waiting = (r for r in self.waiting.values() if not r.paused)
        credit = self.credit.table if self.credit is not None else None
        first = min(waiting, key=lambda r: rule.rank(self.claim(r), held, credit), default=None)
        if first is None or first.adapter is None or gate.room(first):
            return []
        slots = gate.slots_of(first)
        assert slots is not None  # room() is True for a request whose base has no pool
        holders: dict[str, list[CoreRequest]] = {}
        for r in self.running.values():
            if r.adapter_slot >= 0 and r.adapter is not None and gate.slots_of(r) is slots:
                holders.setdefault(r.adapter, []).append(r)
        priority = first.sched.request_priority
        best: list[CoreRequest] = []
        for adapter in slots.resident:  # least recently used first
            rs = holders.get(adapter, [])
            if not rs or (best and len(rs) >= len(best)):
                continue
            if all(
                not r.paused and r.sched.request_priority < priority and rule.preemptible(self.claim(r))
                for r in rs
            ):
                best = rs
        if best:
            self.slot_claimant = first
        return best

    def take_claimed_slot(self) -> None:
        """The holders :meth:`preemption_victims` named for :attr:`slot_claimant` were preempted: it
        takes the freed slot now, before they could take it back, and keeps it while it waits for
        its prefill."""
        r, self.slot_claimant = self.slot_claimant, None
        if r is not None and r.sched.request_id in self.waiting:
            self.take_adapter(r)

    def fail_stuck(self, scheds_w: list[SchedRequest], pool: PoolView) -> None:
        """Nothing runs and the policy chose nothing: waiting requests that can never fit the pool
        leave the core as failed (:meth:`drain_failed`)."""
        for s in stuck_requests(scheds_w, [], pool):
            r = self.requests.pop(s.request_id)
            self.waiting.pop(s.request_id)
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

    # ---------------------------------------------------------------------------- prefix cache
    def cached_prefix(self, r: CoreRequest) -> list[int]:
        """The hashes of the cached blocks ``r``'s next prefill may start on (none when caching is off
        or its prompt ids are unknown); at least its last prompt token is left to compute."""
        if not self.prefix_caching or r.prompt_ids is None:
            return []
        tpb = self.tpb[r.sched.model]
        hashes = r.block_hashes(tpb)
        if not hashes:
            return []
        n = min(self.alloc.match(hashes), (r.sched.prompt_tokens - 1) // tpb)
        return hashes[:n]

    def cached_tokens(self, r: CoreRequest, refresh: bool = False) -> int:
        """Prompt tokens ``r``'s next prefill would take from the prefix cache now; with ``refresh``,
        the idle blocks found become the most recently used (``r`` is about to need them)."""
        hit = self.cached_prefix(r)
        if not hit:
            return 0
        if refresh:
            self.alloc.touch(hit)
        return len(hit) * self.tpb[r.sched.model]

    def cache_filled(self, members: Sequence[CoreRequest], produced: Sequence[int] | None) -> None:
        """The step that ended filled blocks of ``members``: name each block that became full (as vLLM
        does): prompt blocks after their prefill, output blocks as decoding fills them (when the
        request's output ids are known), before a finished member's KV is freed. Members that produced
        nothing (a failed step: no K/V written) name none."""
        if not self.prefix_caching:
            return
        tpbs = self.tpb
        for i, r in enumerate(members):
            if r.prompt_ids is None:
                continue
            s = r.sched
            tpb = tpbs.get(s.model)
            if tpb is None:  # its model was unloaded while the step ran: its blocks are gone
                continue
            full = (s.prompt_tokens + s.generated - 1) // tpb  # blocks whose every token has K/V
            if full > r.filled and (produced is None or produced[i]):
                named = r.filled
                r.filled = full
                hashes = r.filled_block_hashes(tpb, full)
                n = min(full, len(hashes))
                if n > named and s.request_id in self.alloc:
                    self.alloc.cache_blocks(s.request_id, hashes[named:n], named)

    def note_prefix(self, prompt_tokens: int, cached: int) -> None:
        """A prefill of ``prompt_tokens`` looked up the cache and took ``cached`` tokens from it."""
        if self.prefix_caching:
            self.prefix_queries += prompt_tokens
            self.prefix_hits += cached

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
        batch = cast(Batch, plan.batch)  # may_chunk: a continuous plan, whose batch is a request policy's
        return chunkable_policy(self).stable_until(batch, plan.waiting_seen, plan.running_seen, now)

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
        return self.stepper.complete(self, plan, StepEnd(now, durations, produced, finished))

    # ---------------------------------------------------------------------------- static stepper
    def _static_stepper(self) -> StaticStepper:
        if not isinstance(self.stepper, StaticStepper):
            raise RuntimeError("the core runs a continuous stepper: no static batch")
        return self.stepper

    def static_steps_left(self, plan: StepPlan, cap: int | None = None) -> int:
        """Iterations the static batch may run from ``plan`` on (``cap``, the slice limit and the
        KV): a simulator may set ``plan.iterations`` up to this, every row growing a slot per extra
        iteration."""
        return self._static_stepper().steps_left(self, plan, cap)

    def reserve_ahead(self, plan: StepPlan, k: int) -> None:
        """Run the static ``plan`` for ``k`` iterations, every row's padded KV for all of them reserved
        now (HF's static cache); ``k`` within :meth:`static_steps_left`."""
        if not plan.static or plan is not self._plan or k < 1:
            raise ValueError("reserve_ahead takes the static plan in flight and k >= 1")
        if k > 1:
            self.alloc.grow_each([r.sched.request_id for r in plan.rows], k - 1)
        plan.iterations = k
        plan.reserved = k - 1
