"""SCLS central scheduling in the simulator (Cheng et al. 2024, §4.1 Fig. 6, §4.4–4.6).

The paper's scheduler, not an engine-local batcher: arrivals enter a central **request pool**; every
interval T the scheduler fetches the whole pool, partitions it with the serving-time DP (Algorithm 1,
:func:`~llmfleet.policies.batching.scls_dp.dp_batches`), offloads the batches max-min
(:meth:`~llmfleet.policies.dispatch.scls_maxmin.SclsMaxMin.assign_batches`: longest estimate first to
the least-loaded worker, Eq. 11) into the workers' local queues, and updates
T ← max(λ·min_w T_load(w), Γ) after the offloading (Eq. 12, :meth:`SclsMaxMin.interval`). A worker
serves its queue in order, one static batch at a time (the engine core's static mode: rows padded to
the longest input, padded KV reserved, at most S iterations; with ``static_release="batch_end"``, HF
``generate``, finished rows are delivered when the batch ends, and a batch ends before S only when
every row finished — the paper's "early return"). When a batch ends its worker's load drops by the
batch's **estimate** (:meth:`SclsMaxMin.complete_batch`), and its unfinished requests go back to the pool
with input length = prompt + tokens so far, to be re-batched with new arrivals at the next tick.

Slice end (``slice_end``):

* ``"recompute"`` (default, the paper): the unfinished request's KV is freed with its batch; its next
  slice, wherever it runs, re-prefills prompt + output so far (padded like any row).
* ``"keep"`` (our extension, a paged engine can keep a sequence's KV): the KV (prompt + output so far)
  stays on the worker while the request waits in the pool. A batch that brings it back to the *same*
  worker skips its prefill: the first iteration prefills the other rows and decodes the kept ones (one
  fused forward, ``LinearCost.iteration``). Re-batched onto another worker it re-prefills there and the
  kept copy is freed at the offload. Kept KV only uses free memory: before a batch starts (and before a
  new copy is kept) the worker evicts kept copies oldest first until the batch's padded reservation
  n·⌈(L + S)/block⌉ fits; an evicted request re-prefills. The DP and the max-min estimates are the
  paper's in both modes; by default the offloader does not know which worker keeps what, so a row
  returns to its worker only by chance. ``keep_affinity`` (keep mode only) credits each worker with the
  prefill a batch would skip there, T_prefill(k kept rows, L) (``assign_batches(credit=…)``): the batch
  goes to the worker minimising load − credit.

Memory (Eq. 9 in blocks): a run of n rows padded to L fits when n·⌈(L+S)/tokens-per-block⌉ ≤
⌊ζ·(blocks − watermark)⌋ of the smallest worker serving the model (the paper's workers are identical).
Runs are also bounded by the rows the engine can hold and run at once, min(``max_running``,
``max_batch_requests``) (an engine limit, 256 by default). The engine-local batcher's extra bound
n·L ≤ ``max_prefill_tokens`` is **not** applied (the paper bounds memory only); pass ``max_prefill_tokens`` to restore it (the simulator sizes each instance's
activation reserve for ``EngineSettings.max_prefill_tokens`` tokens, so without the bound a larger
padded prefill's activations are not charged: keep ``max_prefill_tokens`` ≥ the largest padded prefill
the memory bound allows, or pass the bound).

A request whose padded single-row slice cannot fit a worker at all fails (as the engine core fails a
stuck prompt). One pool per model: batches of a model go to the workers serving it; the loads are shared.
The instance set is fixed (no placement loop, no migration) in this mode.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from llmfleet.engine_core import CoreRequest
from llmfleet.policies.batching.base import StaticBatch
from llmfleet.policies.batching.scls_dp import SclsWorkerQueue, SliceCost, dp_batches
from llmfleet.policies.dispatch.scls_maxmin import GAMMA_HF_S, SclsMaxMin
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.spec import SimService

if TYPE_CHECKING:
    from llmfleet.sim.instance import SimInstance
    from llmfleet.sim.simulator import Simulator

CENTRAL_MODES = ("scls_central",)
SLICE_END_MODES = ("recompute", "keep")


@dataclass(frozen=True)
class CentralBatch:
    """One batch of one tick: its key in the max-min books (``seq`` is unique per run)."""

    seq: int
    model: str
    request_ids: tuple[str, ...]
    padded_len: int
    estimate_s: float


@dataclass
class _Entry:
    """A request in the pool: fresh (``core`` None) or back from a slice (its core request, folded)."""

    rec: RequestRecord
    svc: SimService
    predicted: float | None
    core: CoreRequest | None = None
    since: float = 0.0

    @property
    def input_len(self) -> int:
        """The DP's length: prompt + tokens so far (the folded prompt of a returned request)."""
        return self.core.sched.prompt_tokens if self.core is not None else self.rec.prompt_tokens


@dataclass
class CentralStats:
    """What the central loop did (``report["scls_central"]``)."""

    slice_end: str = "recompute"
    slice_iterations: int = 128
    ticks: int = 0
    batches: int = 0  # offloaded
    batches_done: int = 0
    offloaded_rows: int = 0
    returns: int = 0  # unfinished requests back to the pool at a slice end
    keep_hits: int = 0  # keep mode: rows re-batched onto the worker holding their KV (no re-prefill)
    keep_misses: int = 0  # keep mode: rows with kept KV re-batched elsewhere (KV freed, re-prefill)
    kept_evicted: int = 0  # keep mode: kept KV evicted for memory (re-prefill)
    kept_dropped: int = 0  # keep mode: returned rows whose KV could not be kept at all
    max_pool: int = 0
    max_padded_prefill_tokens: int = (
        0  # largest n·L offloaded (the activation reserve covers max_prefill_tokens)
    )
    failed: int = 0
    intervals: list[tuple[float, float]] = field(default_factory=list)  # (tick time, next interval)
    pool_sizes: list[int] = field(default_factory=list)  # per tick
    batch_sizes: list[int] = field(default_factory=list)  # per offloaded batch

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mean_batch_size"] = sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0
        d["mean_interval_s"] = (
            sum(t for _, t in self.intervals) / len(self.intervals) if self.intervals else 0.0
        )
        d["mean_pool"] = sum(self.pool_sizes) / len(self.pool_sizes) if self.pool_sizes else 0.0
        for k in ("intervals", "pool_sizes", "batch_sizes"):
            del d[k]
        return d


class SclsCentral:
    """The central pool, the tick loop, the workers' queues and (keep mode) the kept KV."""

    def __init__(
        self,
        cost: SliceCost | Mapping[str, Any] | None = None,
        slice_iterations: int = 128,
        lam: float = 0.5,
        gamma_s: float = GAMMA_HF_S,
        slice_end: str = "recompute",
        zeta: float = 0.9,
        max_prefill_tokens: int | None = None,
        keep_affinity: bool = False,
    ) -> None:
        if keep_affinity and slice_end != "keep":
            raise ValueError("keep_affinity needs slice_end='keep'")
        if slice_end not in SLICE_END_MODES:
            raise ValueError(f"slice_end must be one of {SLICE_END_MODES}, got {slice_end!r}")
        if not (isinstance(zeta, int | float) and 0 < zeta <= 1):
            raise ValueError(f"zeta must be in (0, 1], got {zeta!r}")
        if max_prefill_tokens is not None and max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1 or None, got {max_prefill_tokens}")
        self.maxmin = SclsMaxMin(cost, slice_iterations, lam, gamma_s)
        self.cost = self.maxmin.cost
        self.s = slice_iterations
        self.slice_end = slice_end
        self.zeta = float(zeta)
        self.max_prefill_tokens = max_prefill_tokens
        self.keep_affinity = keep_affinity
        self.pool: dict[str, _Entry] = {}
        self.queues: dict[str, deque[CentralBatch]] = {}
        self.running: dict[str, CentralBatch] = {}  # instance -> batch in progress
        self.kept: dict[str, tuple[str, float]] = {}  # keep mode: request -> (instance, kept since)
        self.stats = CentralStats(slice_end, slice_iterations)
        self._entries: dict[str, _Entry] = {}  # offloaded, not started yet
        self.assignments: list[tuple[float, CentralBatch, str]] = []  # (tick time, batch, worker) in order
        self._seq = 0
        self._tick_at: float | None = None

    # --------------------------------------------------------------------------------- wiring
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
        sim.central = self

    @property
    def busy(self) -> bool:
        """Requests in the pool or batches queued or running: the loop has work."""
        return bool(self.pool or self.running or any(self.queues.values()))

    # --------------------------------------------------------------------------------- intake
    def intake(
        self, sim: Simulator, rec: RequestRecord, svc: SimService, predicted: float | None, now: float
    ) -> None:
        """An arrival enters the pool; the tick loop starts if it was stopped."""
        self.pool[rec.request_id] = _Entry(rec, svc, predicted, None, now)
        self.stats.max_pool = max(self.stats.max_pool, len(self.pool))
        self._ensure_tick(sim, now)

    def _ensure_tick(self, sim: Simulator, t: float) -> None:
        if self._tick_at is None:
            self._tick_at = t
            sim.at(t, self.tick)

    # --------------------------------------------------------------------------------- the tick
    def workers(self, sim: Simulator, model: str) -> list[str]:
        return [iid for iid, i in sim.instances.items() if model in i.serving and i.active]

    def budget_blocks(self, sim: Simulator, workers: list[str]) -> tuple[int, SimInstance]:
        """(⌊ζ·usable blocks⌋ of the smallest worker, that worker)."""
        insts = [sim.instances[w] for w in workers]
        small = min(insts, key=lambda i: i.alloc.num_blocks - i.alloc.watermark_blocks)
        return math.floor(self.zeta * (small.alloc.num_blocks - small.alloc.watermark_blocks)), small

    def partition(
        self, sim: Simulator, model: str, entries: list[_Entry], workers: list[str]
    ) -> list[CentralBatch]:
        """Algorithm 1 over the pool's requests of ``model``: batches with their T_serve estimates."""
        budget, small = self.budget_blocks(sim, workers)
        tpb = small.tpb[model]
        s, cap, cost = self.s, self.max_prefill_tokens, self.cost
        eng = sim.spec.engine  # rows the engine can hold and run in one iteration
        rows = min(eng.max_running, eng.max_batch_requests)

        def blocks(n: int, length: int) -> int:
            return n * -(-(length + s) // tpb)

        def fits(n: int, length: int) -> bool:
            return n <= rows and blocks(n, length) <= budget and (cap is None or n * length <= cap)

        runnable = []
        for e in entries:
            if blocks(1, e.input_len) > small.alloc.num_blocks - small.alloc.watermark_blocks:
                self.pool.pop(e.rec.request_id, None)
                if e.rec.request_id in self.kept:
                    self._free_kept(sim, e.rec.request_id)
                e.rec.failed = (
                    f"input of {e.input_len} tokens + a slice of {s} needs {blocks(1, e.input_len)} KV blocks; "
                    f"a worker has {small.alloc.num_blocks - small.alloc.watermark_blocks}"
                )
                self.stats.failed += 1
                continue
            runnable.append(e)
        lengths = [e.input_len for e in runnable]
        out = []
        for g in dp_batches(lengths, lambda n, ln: cost.t_serve(n, ln, s), fits):
            self._seq += 1
            longest = max(lengths[k] for k in g)
            est = float(cost.t_serve(len(g), longest, s))
            out.append(
                CentralBatch(self._seq, model, tuple(runnable[k].rec.request_id for k in g), longest, est)
            )
        return out

    def tick(self, sim: Simulator, now: float) -> None:
        """Fetch the pool, partition it (DP), offload max-min, update T (Eq. 12), schedule the next tick."""
        self._tick_at = None
        st = self.stats
        st.ticks += 1
        st.pool_sizes.append(len(self.pool))
        by_model: dict[str, list[_Entry]] = {}
        for e in sorted(self.pool.values(), key=lambda e: (e.rec.arrival_s, e.rec.request_id)):
            by_model.setdefault(e.rec.model, []).append(e)
        touched: set[str] = set()
        all_workers: dict[str, None] = {}
        for model, entries in by_model.items():
            workers = self.workers(sim, model)
            if not workers:
                for e in entries:
                    self.pool.pop(e.rec.request_id)
                    e.rec.failed = f"no instance serves model {model!r}"
                    st.failed += 1
                continue
            all_workers.update(dict.fromkeys(workers))
            batches = self.partition(sim, model, entries, workers)
            credit = self._credit if self.keep_affinity else None
            assigned = self.maxmin.assign_batches([(b, b.estimate_s) for b in batches], workers, credit)
            for b, w in assigned:
                self.queues[w].append(b)
                self.assignments.append((now, b, w))
                touched.add(w)
                st.batches += 1
                st.offloaded_rows += len(b.request_ids)
                st.batch_sizes.append(len(b.request_ids))
                st.max_padded_prefill_tokens = max(
                    st.max_padded_prefill_tokens, len(b.request_ids) * b.padded_len
                )
                for rid in b.request_ids:
                    e = self.pool.pop(rid)
                    self._entries[rid] = e
                    held = self.kept.get(rid)
                    if held is not None and held[0] != w:  # batched elsewhere: re-prefill there
                        self._free_kept(sim, rid)
                        st.keep_misses += 1
        for w in touched:
            inst = sim.instances[w]
            if inst.work is None and inst.core.static_batch is None:
                sim._kick(inst, now)
        names = list(all_workers) or list(self.queues)
        interval = self.maxmin.interval(names)
        st.intervals.append((now, interval))
        if self.busy or sim.pending_arrivals:
            self._tick_at = now + interval
            sim.at(now + interval, self.tick)

    def _credit(self, b: CentralBatch, worker: str) -> float:
        """keep_affinity: the prefill a batch skips on ``worker`` (its rows kept there), estimated as
        T_serve(k, L, 0) = T_prefill(k, L) of those k rows padded to the batch's length."""
        k = sum(1 for rid in b.request_ids if self.kept.get(rid, ("",))[0] == worker)
        return float(self.cost.t_serve(k, b.padded_len, 0)) if k else 0.0

    # --------------------------------------------------------------------------------- workers
    def on_idle(self, sim: Simulator, inst: SimInstance, now: float) -> None:
        """``inst`` is between batches: its slice-end returns go to the pool, its next batch is admitted."""
        core = inst.core
        for rid in list(core.waiting):  # rows requeued by the batch that just ended
            r = core.remove(rid)
            if r is not None:
                self._return(sim, inst, r, now)
        q = self.queues.get(inst.instance_id)
        if not q:
            return
        b = q.popleft()
        members = [self._entries.pop(rid) for rid in b.request_ids]
        if self.slice_end == "keep":
            for rid in b.request_ids:
                held = self.kept.get(rid)
                if held is not None and held[0] == inst.instance_id:
                    self._free_kept(sim, rid)
                    inst.skip_prefill.add(rid)
                    self.stats.keep_hits += 1
            self._make_room(sim, inst, len(b.request_ids) * -(-(b.padded_len + self.s) // inst.tpb[b.model]))
        for e in members:
            rec = e.rec
            rec.instance = inst.instance_id
            sim._where[rec.request_id] = inst
            if e.core is None:
                if rec.solo_s == 0.0:
                    rec.solo_s = sim.cost.solo_time(rec.model, inst.tp, rec.prompt_tokens, rec.output_tokens)
                deadline = rec.arrival_s + e.svc.deadline_s if e.svc.deadline_s is not None else None
                inst.admit(rec, e.svc.max_tokens, now, e.predicted, deadline)
            else:
                core.add(e.core, now)
        feed = inst.policy
        assert isinstance(feed, SclsWorkerQueue)
        feed.push(StaticBatch(b.model, b.request_ids, self.s))
        self.running[inst.instance_id] = b

    def _batch_done(self, instance_id: str, batch: StaticBatch, now: float) -> None:
        b = self.running.pop(instance_id, None)
        if b is not None:
            self.maxmin.complete_batch(b)  # load −= the estimate
            self.stats.batches_done += 1

    def _return(self, sim: Simulator, inst: SimInstance, r: CoreRequest, now: float) -> None:
        """An unfinished row of the batch that ended goes back to the pool (its core request folded)."""
        rec: RequestRecord = r.payload
        rid = rec.request_id
        sim._where.pop(rid, None)
        svc = sim._service(rec.service)
        self.pool[rid] = _Entry(rec, svc, r.sched.predicted_output_tokens, r, now)
        self.stats.returns += 1
        self.stats.max_pool = max(self.stats.max_pool, len(self.pool))
        if self.slice_end == "keep":
            tokens = r.sched.prompt_tokens  # prompt + output so far
            need = -(-tokens // inst.tpb[rec.model])
            self._make_room(sim, inst, need)
            if inst.alloc.free_blocks >= need:
                inst.alloc.reserve(kept_key(rid), rec.model, tokens)
                self.kept[rid] = (inst.instance_id, now)
            else:
                self.stats.kept_dropped += 1
        self._ensure_tick(sim, now)

    def _free_kept(self, sim: Simulator, rid: str) -> None:
        iid, _ = self.kept.pop(rid)
        sim.instances[iid].alloc.free(kept_key(rid))

    def _make_room(self, sim: Simulator, inst: SimInstance, need_blocks: int) -> None:
        """Evict ``inst``'s kept KV, oldest first, until ``need_blocks`` blocks are free."""
        if inst.alloc.free_blocks >= need_blocks:
            return
        mine = sorted(((since, rid) for rid, (iid, since) in self.kept.items() if iid == inst.instance_id))
        for _, rid in mine:
            if inst.alloc.free_blocks >= need_blocks:
                break
            self._free_kept(sim, rid)
            self.stats.kept_evicted += 1


def kept_key(request_id: str) -> str:
    """The allocator sequence id of a request's kept KV (keep mode)."""
    return f"kept:{request_id}"


def make_central(mode: str, options: Mapping[str, Any]) -> SclsCentral:
    if mode not in CENTRAL_MODES:
        raise ValueError(f"unknown central mode {mode!r}; valid: {list(CENTRAL_MODES)}")
    return SclsCentral(**dict(options))
