"""SCLS central scheduling in the simulator: the driver of the pure policy
:class:`~llmfleet.policies.central.scls_central.SclsCentralPolicy` (the algorithm, the slice-end modes and
the memory rules are documented there).

The driver keeps the clock and the instances' side: arrivals go to the policy's pool (no dispatch at
arrival); a tick (a one-shot hook, rescheduled every interval T while there is work) asks the policy for
its plan, fails what it could not place, frees the kept KV it names and queues each offloaded batch on its
worker. A worker serves its queue in order, one static batch at a time (its engine policy is an
:class:`~llmfleet.policies.batching.scls_dp.SclsWorkerQueue`: the engine core's static mode, rows padded to
the longest input, padded KV reserved, at most S iterations; with ``static_release="batch_end"``, HF
``generate``, finished rows are delivered when the batch ends — the paper's "early return"). Between
batches (the fleet's ``on_idle`` hook) the driver sends the batch's unfinished rows back to the pool with
their core requests folded (prompt + tokens so far), keeps their KV in keep mode, and admits the next
batch. The policy runs with ``oversized="fail"``: a request whose padded single-row slice cannot fit a
worker fails, as the engine core fails a stuck prompt.

The simulator sizes each instance's activation reserve for ``EngineSettings.max_prefill_tokens`` tokens and
the policy does not bound n·L by it unless asked: keep ``max_prefill_tokens`` ≥ the largest padded prefill
the memory bound allows, or pass the bound. The instance set is fixed (no placement loop, no migration).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from llmfleet.engine_core import CoreRequest
from llmfleet.policies.batching.base import StaticBatch
from llmfleet.policies.batching.scls_dp import SclsWorkerQueue
from llmfleet.policies.capacity.priority import request_priority
from llmfleet.policies.central.scls_central import (
    MODE,
    CentralBatch,
    Offload,
    PoolEntry,
    SclsCentralOptions,
    SclsCentralPolicy,
    WorkerView,
)
from llmfleet.policies.registry import instantiate
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.spec import SimService

if TYPE_CHECKING:
    from llmfleet.sim.instance import SimInstance
    from llmfleet.sim.simulator import Simulator

__all__ = ["SclsCentral", "kept_key", "make_central"]


@dataclass
class Pooled:
    """The simulator's side of a pooled request: fresh (``core`` None) or back from a slice (its core
    request, folded)."""

    rec: RequestRecord
    svc: SimService
    predicted: float | None
    core: CoreRequest | None = None


class SclsCentral:
    """The simulator's driver of the central policy: the tick loop, the workers' queues and the kept KV
    in the instances' allocators."""

    Options: ClassVar[type[SclsCentralOptions]] = SclsCentralOptions

    def __init__(self, options: SclsCentralOptions | None = None) -> None:
        """``options``: the policy's (:class:`SclsCentralOptions`)."""
        self.policy = SclsCentralPolicy(options)
        # the policy's own objects: the max-min books (also the simulator's dispatch policy object in this
        # mode), the stats, the pool and the kept KV
        self.maxmin, self.stats = self.policy.maxmin, self.policy.stats
        self.pool, self.kept = self.policy.pool, self.policy.kept
        self.queues: dict[str, deque[Offload]] = {}
        self.running: dict[str, CentralBatch] = {}  # instance -> batch in progress
        self.assignments: list[tuple[float, CentralBatch, str]] = []  # (tick time, batch, worker) in order
        self._tick_at: float | None = None
        self._sim: Simulator | None = None

    # ---------------------------------------------------------------------------------------- wiring
    @staticmethod
    def make_feed() -> SclsWorkerQueue:
        """The engine-local policy of a central-mode instance (its local queue of offloaded batches)."""
        return SclsWorkerQueue()

    def install(self, sim: Simulator) -> None:
        for iid, inst in sim.instances.items():
            if not isinstance(inst.policy, SclsWorkerQueue):
                raise ValueError(f"instance {iid}: central mode needs SclsWorkerQueue engines (make_feed)")
            inst.policy.on_done = lambda batch, now, iid=iid: self._batch_done(iid, batch, now)
            self.queues[iid] = deque()
        self._sim = sim
        sim.central = self
        sim.fleet.on_idle = self.on_idle

    @property
    def busy(self) -> bool:
        """Requests in the pool or batches queued or running: the loop has work."""
        return bool(self.pool or self.running or any(self.queues.values()))

    def _simulator(self) -> Simulator:
        if self._sim is None:
            raise RuntimeError("SclsCentral is not installed on a simulator")
        return self._sim

    # ---------------------------------------------------------------------------------------- intake
    def intake(self, rec: RequestRecord, svc: SimService, predicted: float | None, now: float) -> None:
        """An arrival enters the pool; the tick loop starts if it was stopped."""
        self.policy.add(PoolEntry(rec.request_id, rec.model, rec.arrival_s, rec.prompt_tokens,
                                  Pooled(rec, svc, predicted)))  # fmt: skip
        self._ensure_tick(now)

    def _ensure_tick(self, t: float) -> None:
        if self._tick_at is None:
            self._tick_at = t
            self._simulator().at(t, self.tick)

    # ------------------------------------------------------------------------------------------ tick
    def _workers(self, model: str) -> list[WorkerView]:
        return [
            WorkerView(i.instance_id, i.alloc.num_blocks - i.alloc.watermark_blocks, i.tpb[model])
            for i in self._simulator().fleet.hosts(model)
        ]

    def tick(self, sim: Simulator, now: float) -> None:
        """Plan the pool (the policy), queue the batches on their workers, schedule the next tick."""
        self._tick_at = None
        eng = sim.spec.engine  # rows the engine can hold and run in one iteration
        plan = self.policy.plan(self._workers, min(eng.max_running, eng.max_batch_requests))
        for model, entries in plan.unserved.items():
            for e in entries:
                self.policy.fail(e.request_id)
                e.payload.rec.failed = f"no instance serves model {model!r}"
        for e, why in plan.failed:
            e.payload.rec.failed = why
        self._free(plan.freed)
        touched: dict[str, None] = {}
        for off in plan.assigned:
            self.queues[off.worker].append(off)
            self.assignments.append((now, off.batch, off.worker))
            touched[off.worker] = None
        for w in touched:
            inst = sim.fleet.instances[w]
            if inst.work is None and inst.core.static_batch is None:
                sim.fleet.kick(inst, now)
        interval = self.policy.interval(plan.workers or list(self.queues), now)
        if self.busy or sim.pending_arrivals:
            self._tick_at = now + interval
            sim.at(now + interval, self.tick)

    # --------------------------------------------------------------------------------------- workers
    def on_idle(self, inst: SimInstance, now: float) -> None:
        """``inst`` is between batches: its slice-end returns go to the pool, its next batch is admitted."""
        core = inst.core
        for rid in list(core.waiting):  # rows requeued by the batch that just ended
            r = core.remove(rid)
            if r is not None:
                self._return(inst, r, now)
        q = self.queues.get(inst.instance_id)
        if not q:
            return
        off = q.popleft()
        b = off.batch
        skip, freed = self.policy.start_batch(off, inst.alloc.free_blocks, inst.tpb[b.model])
        self._free(freed)
        inst.skip_prefill.update(skip)
        sim = self._simulator()
        for e in off.entries:
            p: Pooled = e.payload
            rec = p.rec
            rec.instance = inst.instance_id
            sim.fleet.track(rec.request_id, inst)
            if p.core is None:
                if rec.solo_s == 0.0:
                    rec.solo_s = sim.cost.solo_time(
                        rec.model, sim.fleet.reference_tp[rec.model], rec.prompt_tokens, rec.output_tokens
                    )
                deadline = rec.arrival_s + p.svc.deadline_s if p.svc.deadline_s is not None else None
                priority = request_priority(rec.priority, p.svc.priority, None)
                inst.admit(rec, p.svc.max_tokens, now, p.predicted, deadline, priority=priority)
            else:
                core.add(p.core, now)
        feed = inst.policy
        assert isinstance(feed, SclsWorkerQueue)
        feed.push(StaticBatch(b.model, b.request_ids, self.policy.s))
        self.running[inst.instance_id] = b

    def _batch_done(self, instance_id: str, batch: StaticBatch, now: float) -> None:
        b = self.running.pop(instance_id, None)
        if b is not None:
            self.policy.batch_done(b)  # load −= the estimate

    def _return(self, inst: SimInstance, r: CoreRequest, now: float) -> None:
        """An unfinished row of the batch that ended goes back to the pool (its core request folded)."""
        rec: RequestRecord = r.payload
        rid = rec.request_id
        fleet = self._simulator().fleet
        fleet.release(rid)
        tokens = r.sched.prompt_tokens  # prompt + output so far
        pooled = Pooled(rec, fleet.service(rec.service), r.sched.predicted_output_tokens, r)
        keep, freed = self.policy.slice_returned(
            PoolEntry(rid, rec.model, rec.arrival_s, tokens, pooled), inst.instance_id, now,
            -(-tokens // inst.tpb[rec.model]), inst.alloc.free_blocks,
        )  # fmt: skip
        self._free(freed)
        if keep:
            inst.alloc.reserve(kept_key(rid), rec.model, tokens)
        self._ensure_tick(now)

    def _free(self, kept: list[tuple[str, str]]) -> None:
        """Free kept KV copies, (request id, instance)."""
        instances = self._simulator().fleet.instances
        for rid, iid in kept:
            instances[iid].alloc.free(kept_key(rid))


def kept_key(request_id: str) -> str:
    """The allocator sequence id of a request's kept KV (keep mode)."""
    return f"kept:{request_id}"


def make_central(mode: str, options: Mapping[str, Any]) -> SclsCentral:
    """The driver of central mode ``mode`` with the policy's options record built from ``options`` (a
    ValueError naming an unknown mode or a bad option)."""
    return instantiate("central", {MODE: SclsCentral}, mode, options)
