"""One simulated engine instance: the shared :class:`~llmfleet.engine_core.EngineCore` with time from
the cost model.

The core (the very object the live engine drives) picks each step, sets up its KV and preempts; this
instance only prices the step with the cost model and fast-forwards:

* **Chunks (exact).** When the core says a pure-decode plan stays the policy's choice until a horizon
  (``EngineCore.horizon``: the policy's ``stable_until``), the instance runs it up to the first finish,
  the horizon or the KV bound as one event of k iterations, and the core charges the policy the k
  durations. An arrival truncates the chunk to the iteration in progress (:meth:`interrupt`), so the
  policy sees it at the same boundary as without chunking.
* **Static batches** (a :class:`~llmfleet.policies.batching.StaticBatchPolicy`, the core's static mode):
  the whole padded batch — its prefill and every decode to the longest output, the slice limit or the
  KV bound — is one event. ``static_release="batch_end"`` (HF ``generate``) delivers outputs when the
  batch ends, ``"eos"`` when each row finishes.

**LoRA adapters** (``engine.max_loras`` > 0): a request of a service that names an adapter runs on its
base model with the native engine's rules: each base has a pool of ``max_loras`` slots
(:class:`~llmfleet.engine_core.AdapterSlots`: LRU, a running request pins its adapter), held through the
engine core's adapter rule (:class:`~llmfleet.engine_core.AdapterGate`, as the live engines): a
request takes its adapter when the core admits it into a step, and an adapter not resident is loaded
then, which adds its load time to that step (:meth:`LoraCost.load_seconds
<llmfleet.costmodel.lora.LoraCost.load_seconds>`); a request whose adapter finds every slot held by
other adapters' running requests stays waiting in the core until one frees. Adapters share the base's KV pool and block geometry; the prefix cache is keyed by
the adapter (``CoreRequest.prefix_key``), so two adapters never share a block. Each continuous step
is charged the rank-r matmuls of its adapter rows (:meth:`LoraCost.batch_seconds
<llmfleet.costmodel.lora.LoraCost.batch_seconds>`, at ``max_lora_rank``: the pool pads every adapter
to it). Static batches are not charged for LoRA.

Its models can change between steps (:mod:`llmfleet.sim.fleet`): ``serving`` models take new requests,
``loading`` ones have their memory claimed while their weights arrive, ``removing`` ones take none and
unload once their requests have left, ``to_load`` ones wait for memory; :meth:`rehost` resizes the KV
pool for a new resident set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
from llmfleet.costmodel import Hardware, ModelArch
from llmfleet.costmodel.lora import LoraCost
from llmfleet.engine_core import AdapterGate, AdapterSlots, CoreRequest, EngineCore, StepPlan, adapter_rows
from llmfleet.engine_core.core import DEFAULT_PREEMPTION
from llmfleet.kvblocks import BlockAllocator
from llmfleet.policies.batching import StaticBatchPolicy
from llmfleet.policies.request import PoolView, RequestPolicy, SchedRequest
from llmfleet.policies.request.preemption import PreemptionRule
from llmfleet.sim.cost import CostBook
from llmfleet.sim.decode_only import prefilled
from llmfleet.sim.memory import pool_layout
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.spec import EngineSettings
from llmfleet.workload.prompts import output_token_ids, prompt_token_ids
from llmfleet.workload.request import WorkloadRequest

Fail = Callable[[CoreRequest, str], None]


def _output_ids(r: WorkloadRequest) -> list[int]:
    """The token ids of the output the workload assumes for ``r``."""
    return output_token_ids(r).tolist()


@dataclass(slots=True)
class _Work:
    """The step in flight: ``plan.iterations`` iterations from ``start`` to ``end``. A chunk or a static
    batch keeps every iteration's bounds in ``starts``/``ends`` (``end == ends[k-1]``)."""

    plan: StepPlan
    start: float
    end: float
    starts: np.ndarray | None = None
    ends: np.ndarray | None = None

    @property
    def members(self) -> list[CoreRequest]:
        return self.plan.rows if self.plan.static else self.plan.members

    @property
    def first_end(self) -> float:
        """End of the first iteration (when a prefill's first token appears)."""
        return self.end if self.ends is None else float(self.ends[0])


def record_of(r: CoreRequest) -> RequestRecord:
    return r.payload


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
        preemption: PreemptionRule | None = DEFAULT_PREEMPTION,
    ) -> None:
        self.instance_id = instance_id
        self.models = models
        self.tp = tp
        self.engine = engine
        self.cost = cost
        self.policy = policy
        self.hw = hw
        self.archs = archs
        self.layout = pool_layout(hw, tp, [archs[m] for m in models], engine)
        self.alloc = BlockAllocator(self.layout.num_blocks, self.layout.block_bytes, engine.watermark)
        for m in models:
            self.alloc.register_model(m, archs[m].kv_shape)
        gate = AdapterGate(self._slots_of, self._adapter_loaded) if engine.max_loras else None
        self.core = EngineCore(policy, self.alloc, engine.limits, preemption=preemption, adapters=gate)
        for m in models:
            self.core.add_model(m)
        self.static = self.core.static
        self.tpb = self.core.tpb
        self.waiting = self.core.waiting
        self.running = self.core.running
        self._lm = {m: cost.model(m, tp) for m in models}  # this instance's latency model per model
        self.work: _Work | None = None
        self.version = 0
        self.fast_forward = fast_forward and (self.core.chunkable or self.static)
        self.iterations = 0
        self.busy_s = 0.0
        self._batch_end_rows: list[CoreRequest] = []  # static, batch_end release: finished, not delivered
        # static: batches ended, those that ended before their slice limit because every row finished
        # (SCLS's "early return"), and the iterations of the batch in progress
        self.static_batches = 0
        self.early_returns = 0
        self._batch_iters = 0
        # rows of the next static batch whose KV this instance kept (SCLS central keep mode): no prefill
        self.skip_prefill: set[str] = set()
        # lifecycle (llmfleet.sim.fleet); an instance of the initial plan serves all its models from the start
        self.serving: tuple[str, ...] = models  # resident models taking new requests
        self.loading: dict[str, float] = {}  # resident, weights arriving: model -> ready time
        self.removing: set[str] = set()  # resident, no new requests; unloaded once their requests left
        self.to_load: dict[str, float] = {}  # not resident yet (waiting for memory): model -> load seconds
        self.cancelled: dict[str, float] = {}  # removed while loading, still resident: model -> ready time
        self.inbound: dict[str, int] = {}  # requests moving here, per model (their model stays resident)
        self.landing: list[CoreRequest] = []  # moved requests that arrived during a step: join after it
        # moves asked for while the request was in the step in flight: leave when it ends (dst, s, reprefill)
        self.outbound: dict[str, tuple[str, float, bool]] = {}
        self.move_out = True  # move the removed models' requests to other hosts (False: drain them here)
        self.started_s: float | None = 0.0  # when it took its GPUs (None: waiting for GPUs)
        self.released_s: float | None = None  # when it gave them back
        # LoRA: per base model its adapter slots and costs; each adapter's rank; loads so far
        self.adapter_slots: dict[str, AdapterSlots] = {}
        self._lora: dict[str, LoraCost] = {}
        self._ranks: dict[str, int] = {}
        self.adapter_loads = 0
        self._load_debt = 0.0  # adapter load seconds the next step waits for
        self._lora_models(models)

    def _lora_models(self, models: tuple[str, ...]) -> None:
        """Adapter pools for ``models`` (kept for those that stay, dropped for those that left)."""
        n = self.engine.max_loras
        if not n:
            return
        self.adapter_slots = {m: self.adapter_slots.get(m) or AdapterSlots(n) for m in models}
        rank = self.engine.max_lora_rank
        self._lora = {m: self._lora.get(m) or LoraCost(self.archs[m], self.hw, self.tp, rank) for m in models}

    def _slots_of(self, r: CoreRequest) -> AdapterSlots | None:
        return self.adapter_slots.get(r.sched.model)

    def _adapter_loaded(self, r: CoreRequest, slot: int) -> None:
        """The core admitted ``r`` and put its adapter in a slot: the step waits for the copy."""
        self.adapter_loads += 1
        self._load_debt += self._lora[r.sched.model].load_seconds(self._ranks[r.adapter or ""])

    def serve_adapter(self, adapter: str, rank: int) -> None:
        """A request of ``adapter`` (of ``rank``) moves in: it takes the adapter's slot as it lands or is
        admitted, which loads the adapter at ``rank``'s cost."""
        self._ranks[adapter] = rank

    @property
    def adapter_evictions(self) -> int:
        return sum(s.evictions for s in self.adapter_slots.values())

    # ------------------------------------------------------------------------------------ lifecycle
    @property
    def active(self) -> bool:
        """Holding GPUs (loading, serving or draining)."""
        return self.started_s is not None and self.released_s is None

    @property
    def pending(self) -> bool:
        """A model change to apply at the next step boundary."""
        return bool(self.removing or self.to_load) or (not self.models and self.active)

    @property
    def target(self) -> tuple[str, ...]:
        """The models it will host once the changes under way are done."""
        return tuple(m for m in self.models if m not in self.removing) + tuple(self.to_load)

    def rehost(self, models: tuple[str, ...], now: float) -> list[CoreRequest]:
        """Make ``models`` the resident set, between steps: a new KV pool sized as at creation
        (:func:`pool_layout`, ``DoesNotFit`` if the weights do not fit) and every running request's KV
        carried over, oldest first; those whose KV no longer fits re-prefill here later (a preemption,
        as an engine evicting KV to load weights). Returns them. Removed models must hold no request."""
        core, old = self.core, self.alloc
        assert self.work is None and core.static_batch is None, "rehost between steps only"
        stray = [r.sched.request_id for r in core.requests.values() if r.sched.model not in models]
        assert not stray, f"requests {stray} of models leaving {self.instance_id}"
        layout = pool_layout(self.hw, self.tp, [self.archs[m] for m in models], self.engine)
        alloc = BlockAllocator(layout.num_blocks, layout.block_bytes, self.engine.watermark)
        for m in models:
            alloc.register_model(m, self.archs[m].kv_shape)
        bumped: list[CoreRequest] = []
        for rid, r in core.running.items():
            n = old.num_tokens(rid) if rid in old else 0
            if n and alloc.can_allocate(r.sched.model, n, ignore_watermark=True):
                alloc.reserve(rid, r.sched.model, n)
            elif n:
                bumped.append(r)
        if len(alloc) + len(bumped) != len(old):
            raise RuntimeError(
                f"{self.instance_id}: KV held outside the running requests cannot be carried over"
            )
        for r in bumped:
            core.drop(r.sched.request_id)  # frees its blocks in the old pool
        self.layout, self.alloc, core.alloc = layout, alloc, alloc
        core.watermark_blocks = alloc.watermark_blocks
        for m in [m for m in core.tpb if m not in models]:
            core.remove_model(m)
        for m in models:
            core.add_model(m)  # tokens per block of the new pool
            if m not in self._lm:
                self._lm[m] = self.cost.model(m, self.tp)
        self.models = models
        self._lora_models(models)
        for r in bumped:
            core.land(r, now)  # back to waiting: re-prefills prompt + output so far
            core.preemptions += 1
            record_of(r).preemptions += 1
        return bumped

    # ------------------------------------------------------------------------------------ load view
    @property
    def preemptions(self) -> int:
        return self.core.preemptions

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
        return self.core.pool_view()

    # ------------------------------------------------------------------------------------- requests
    def admit(
        self,
        rec: RequestRecord,
        cap: int,
        now: float,
        predicted: float | None = None,
        deadline: float | None = None,
        lora_rank: int = 16,
        priority: int = 0,
    ) -> None:
        """A request dispatched here at ``now`` joins the core (call :meth:`interrupt` afterwards if
        busy), running at ``priority`` (its own, else its service's: what a live scheduler sends its
        engine); one naming a LoRA adapter (``rec.adapter``, of rank ``lora_rank``) takes it when the
        core admits it."""
        if rec.model not in self.tpb:
            raise ValueError(f"instance {self.instance_id} does not host model {rec.model!r}")
        cap = max(cap, rec.output_tokens)
        if rec.adapter:
            if rec.model not in self.adapter_slots:
                raise ValueError(
                    f"instance {self.instance_id} serves no LoRA adapters (max_loras 0); "
                    f"request {rec.request_id} names {rec.adapter!r}"
                )
            self._ranks[rec.adapter] = lora_rank
        sched = SchedRequest(
            rec.request_id,
            rec.service,
            rec.model,
            now,
            rec.prompt_tokens,
            cap,
            predicted_output_tokens=predicted,
            deadline_s=deadline,
            request_priority=priority,
            tenant=rec.tenant,
        )
        content = rec.content
        ids = prompt_token_ids(content) if content is not None and content.has_content else None
        outputs = (
            partial(_output_ids, content) if ids is not None and content.output_seed is not None else None
        )
        core_req = CoreRequest(sched, rec.prompt_tokens, cap, rec, ids, outputs, adapter=rec.adapter or None)
        if self.engine.decode_only:  # prefilled on a prefill worker: lands with its KV, decodes first
            prefilled(core_req, rec, now)
            if self.work is not None or self.core.static_batch is not None:
                self.landing.append(core_req)  # at the step's end, where the free KV is exact
            else:
                self.core.land(core_req, now, kv_tokens=core_req.kv_tokens)
        else:
            self.core.add(core_req, now)

    def _lora_seconds(self, plan: StepPlan) -> float:
        """The step's LoRA matmuls (its adapter rows) plus the adapter loads it waited for."""
        debt, self._load_debt = self._load_debt, 0.0
        tokens, adapters = adapter_rows(plan)
        return debt + (self._lora[plan.model].batch_seconds(tokens, adapters) if adapters else 0.0)

    def interrupt(self, now: float) -> float | None:
        """Something changed at ``now`` while a chunk is in flight: cut the chunk to the iteration in
        progress. Returns the new end time if it moved (the caller reschedules), else None."""
        w = self.work
        if w is None or w.plan.static or w.plan.iterations == 1 or w.starts is None or w.ends is None:
            return None
        k = max(1, int(np.searchsorted(w.starts[: w.plan.iterations], now, side="left")))
        if k == w.plan.iterations:
            return None
        w.plan.iterations = k
        w.end = float(w.ends[k - 1])
        self.version += 1
        return w.end

    # ------------------------------------------------------------------------------------ iterations
    def start(self, now: float, fail: Fail) -> float | None:
        """Pick and launch the next step at ``now``; its end time, or None when idle."""
        assert self.work is None, "an iteration is already in flight"
        core = self.core
        plan = core.schedule(now)
        failed = core.drain_failed()
        for r, why in failed:
            fail(r, f"{why} (instance {self.instance_id})")
        for r in plan.preempted if plan is not None else ():
            record_of(r).preemptions += 1
        if plan is None:
            self._flush_batch_end(now)
            return None
        for r in plan.prefills:
            rec = record_of(r)
            if rec.cached_tokens is None:  # a recompute after preemption keeps the first count
                rec.cached_tokens = min(r.cached, rec.prompt_tokens)
        if plan.static:
            self.work = self._static_work(plan, now)
        else:
            lm = self._lm[plan.model]
            dur = lm.iteration(plan.prefill_tokens, plan.prefill_sq, plan.decodes, plan.context_tokens)
            lora = self._lora_seconds(plan) if self.adapter_slots else 0.0
            dur += lora
            work = self._chunk(plan, dur, now, lora) if self.fast_forward and not plan.prefills else None
            self.work = work or _Work(plan, now, now + dur)
        self.version += 1
        return self.work.end

    def _chunk(self, plan: StepPlan, dur: float, now: float, lora: float = 0.0) -> _Work | None:
        """Grow a pure-decode iteration of ``dur`` into a chunk, or None when it stays one iteration;
        ``lora``: the LoRA seconds of each iteration after the first (the same members every time).

        Bounds are one ``cumsum`` over [now, dur, d_2, …], the same additions as a running ``t += d``,
        so every iteration ends exactly where iterating one by one would put it."""
        members = plan.members
        if not self.core.may_chunk(plan):
            return None  # (before the member scan below: the common mixed/prefill case is cheap)
        k_max = min([r.payload.output_tokens - r.payload.produced for r in members])
        if k_max <= 1:
            return None
        horizon = self.core.horizon(plan, now)
        if horizon <= now + dur:
            return None
        k_max = self.core.kv_bound(members, k_max)
        if k_max <= 1:
            return None
        n, ctx = plan.decodes, plan.context_tokens
        steps = np.empty(k_max + 1)
        steps[0] = now
        steps[1] = dur
        self._lm[plan.model].decode_steps_into(steps[2:], n, ctx + n, n)
        if lora:
            steps[2:] += self._lora_seconds(plan)  # the members' matmuls (no loads: they were paid)
        bounds = np.cumsum(steps)
        k = k_max
        if horizon != np.inf:  # iterations starting before the horizon
            k = max(1, int(np.searchsorted(bounds[:-1], horizon, side="left")))
        if k == 1:
            return None
        plan.iterations = k
        return _Work(plan, now, float(bounds[k]), bounds[:k], bounds[1 : k + 1])

    def _static_work(self, plan: StepPlan, now: float) -> _Work:
        """A static batch's step: the whole batch at once when fast-forwarding, else one iteration."""
        lm = self._lm[plan.model]
        n, longest = len(plan.rows), plan.padded_len
        if plan.prefills:
            kept = sum(1 for r in plan.rows if r.sched.request_id in self.skip_prefill)
            if kept:  # kept rows decode their next token in the same forward as the others' prefill
                self.skip_prefill.clear()
                fresh = n - kept
                first = lm.iteration(fresh * longest, fresh * longest * longest, kept, kept * longest)
            else:
                first = lm.prefill(plan.prefill_tokens, plan.prefill_sq)
            ctx = n * (longest + 1)
        else:
            first = lm.decode_steps(n, plan.context_tokens, n, 1)[0]
            ctx = plan.context_tokens + n
        if not self.fast_forward:
            return _Work(plan, now, now + float(first))
        remaining = max(self._remaining(r) for r in plan.members)
        k = self.core.static_steps_left(plan, cap=remaining)
        durs = np.concatenate(([now + first], lm.decode_steps(n, ctx, n, k - 1)))
        ends = np.cumsum(durs)
        self.core.reserve_ahead(plan, k)
        return _Work(plan, now, float(ends[-1]), np.concatenate(([now], ends[:-1])), ends)

    @staticmethod
    def _remaining(r: CoreRequest) -> int:
        rec = record_of(r)
        return rec.output_tokens - rec.produced

    def finish_work(self, now: float) -> list[CoreRequest]:
        """Apply the step in flight at its end ``now``; the requests whose output is delivered."""
        w = self.work
        assert w is not None
        self.work = None
        plan = w.plan
        k = plan.iterations
        self.iterations += k
        self.busy_s += w.end - w.start
        if plan.static:
            return self._finish_static(w, now)
        members = plan.members
        first_end = w.first_end
        finished = []
        for r in members:
            rec = r.payload
            rec.produced += k
            if rec.first_token_s is None:
                rec.first_token_s = first_end
            if rec.produced >= rec.output_tokens:
                finished.append(r)
        durations: list[float] | float
        if k > 1 and w.ends is not None and self.core.run_charged:  # the policy is charged per iteration
            durations = np.diff(w.ends[:k], prepend=w.start).tolist()
        else:
            durations = w.end - w.start
        done = self.core.complete(plan, now, durations, finished=finished).finished
        for r in done:
            record_of(r).finish_s = now
        return done

    def _finish_static(self, w: _Work, now: float) -> list[CoreRequest]:
        plan = w.plan
        k = plan.iterations
        eos = self.engine.static_release == "eos"
        ends = w.ends if w.ends is not None else np.array([w.end])
        produced, finished = [], []
        for r in plan.members:
            rec = record_of(r)
            n = min(k, rec.output_tokens - rec.produced)
            produced.append(n)
            rec.produced += n
            if rec.first_token_s is None and eos:
                rec.first_token_s = float(ends[0])
            if rec.produced >= rec.output_tokens:
                finished.append(r)
                rec.finish_s = float(ends[n - 1]) if eos else None
        sb = self.core.static_batch
        self._batch_iters += k
        res = self.core.complete(plan, now, w.end - w.start, produced=produced, finished=finished)
        for r in res.requeued:
            record_of(r).requeues += 1
        if res.batch_rows:
            self.static_batches += 1
            limit = sb.max_iterations if sb is not None else None
            if limit is not None and self._batch_iters < limit and not res.requeued:
                self.early_returns += 1
            self._batch_iters = 0
        if eos:
            return res.finished
        self._batch_end_rows.extend(res.finished)
        if res.batch_rows:
            for r in res.batch_rows:
                if record_of(r).first_token_s is None:
                    record_of(r).first_token_s = now
            return self._flush_batch_end(now)
        return []

    def _flush_batch_end(self, now: float) -> list[CoreRequest]:
        """HF ``generate`` release: rows finished in a static batch are delivered when it ends."""
        if not self._batch_end_rows or self.core.static_batch is not None:
            return []
        out, self._batch_end_rows = self._batch_end_rows, []
        for r in out:
            rec = record_of(r)
            rec.finish_s = now
            if rec.first_token_s is None:
                rec.first_token_s = now
        return out
