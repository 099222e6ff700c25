"""SCLS central scheduling as one pure policy (Cheng et al. 2024, §4.1 Fig. 6, §4.4–4.6).

The paper's scheduler, not an engine-local batcher: arrivals enter a central **request pool**; every
interval T the driver calls :meth:`SclsCentralPolicy.plan`, which fetches the whole pool, partitions each
model's requests with the serving-time DP (Algorithm 1, :func:`~llmfleet.policies.batching.scls_dp.dp_batches`)
and offloads the batches max-min (:meth:`~llmfleet.policies.dispatch.scls_maxmin.SclsMaxMin.assign_batches`:
longest estimate first to the least-loaded worker, Eq. 11); the driver then waits
T ← max(λ·min_w T_load(w), Γ) (Eq. 12, :meth:`SclsCentralPolicy.interval`). A worker's load drops by a
batch's **estimate** when the batch is done (:meth:`batch_done`, or :meth:`member_back` once every member
is back). An unfinished request comes back to the pool with input length = prompt + tokens so far
(:meth:`slice_returned`), to be re-batched with new arrivals at the next tick.

Two drivers call it: the simulator's (:mod:`llmfleet.sim.scls_central`) and the live scheduler's
(``llmfleet_scheduler.scls_central``). The policy keeps no clock and does no I/O: the drivers pass the
time, the workers (:class:`WorkerView`) and the free KV blocks, and apply the decisions it returns.

Slice end (``slice_end``, default :data:`llmfleet.spec.defaults.SLICE_END`):

* ``"recompute"`` (the paper): the unfinished request's KV is freed with its batch; its next slice,
  wherever it runs, re-prefills prompt + output so far (padded like any row).
* ``"keep"`` (our extension, a paged engine can keep a sequence's KV): the KV stays on the worker while the
  request waits in the pool. A batch that brings it back to the *same* worker skips its prefill
  (:meth:`start_batch` names those rows); re-batched onto another worker it re-prefills there and the kept
  copy is freed at the offload. Kept KV only uses free memory: before a batch starts (and before a new copy
  is kept) the worker's kept copies are evicted oldest first until the batch's padded reservation
  n·⌈(L + S)/block⌉ fits; an evicted request re-prefills. ``keep_affinity`` credits each worker with the
  prefill a batch would skip there, T_prefill(k kept rows, L) (``assign_batches(credit=…)``).

Memory (Eq. 9 in blocks): a run of n rows padded to L fits when n·⌈(L+S)/tokens-per-block⌉ ≤
⌊ζ·usable blocks⌋ of the smallest worker serving the model (workers of unknown size do not bound it).
Runs are also bounded by ``max_rows`` (the rows an engine holds and runs at once) and, when given, by
n·L ≤ ``max_prefill_tokens`` (the paper bounds memory only). A request whose padded single row cannot fit
a worker (``oversized``) either fails (``"fail"``: prompt + a whole slice must fit, as the engine core
fails a stuck prompt) or runs alone after the DP's batches (``"alone"``: when even prompt + 1 token does
not fit; the engine preempts or refuses it). One partition per model; the loads are shared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from llmfleet.policies.batching.scls_dp import SliceCost, dp_batches
from llmfleet.policies.checks import positive_int
from llmfleet.policies.dispatch.scls_maxmin import GAMMA_HF_S, SclsMaxMin, SclsMaxMinOptions
from llmfleet.policies.registry import instantiate
from llmfleet.spec.defaults import SLICE_END, SLICE_END_MODES, SliceEnd

MODE = "scls_central"  # the dispatch value that selects central scheduling
CENTRAL_MODES: tuple[str, ...] = (MODE,)
OVERSIZED = ("fail", "alone")


@dataclass(frozen=True)
class CentralBatch:
    """One batch of one tick: its key in the max-min books (``seq`` is unique per policy, from 1)."""

    seq: int
    model: str
    request_ids: tuple[str, ...]
    padded_len: int
    estimate_s: float


@dataclass
class PoolEntry:
    """A request waiting in the pool: ``input_len`` is prompt + tokens so far (the length its next slice
    prefills); ``payload`` is the driver's (what it needs to run the request)."""

    request_id: str
    model: str
    arrival_s: float
    input_len: int
    payload: Any = None


@dataclass(frozen=True)
class WorkerView:
    """What the policy needs of a worker serving a model: its usable KV blocks (total − watermark; None:
    unknown yet) and tokens per block for that model."""

    worker_id: str
    kv_blocks: int | None = None
    tokens_per_block: int = 1


@dataclass(frozen=True)
class Offload:
    """A batch offloaded to ``worker``, with its members (left the pool)."""

    batch: CentralBatch
    worker: str
    entries: tuple[PoolEntry, ...]


@dataclass
class TickPlan:
    """The decisions of one tick. ``failed``: left the pool for good, with why; ``unserved``: per model
    with no worker, its entries (still in the pool: the driver fails or keeps them); ``freed``: kept
    copies to free, (request id, worker); ``workers``: every worker of a model planned this tick."""

    assigned: list[Offload] = field(default_factory=list)
    failed: list[tuple[PoolEntry, str]] = field(default_factory=list)
    unserved: dict[str, list[PoolEntry]] = field(default_factory=dict)
    freed: list[tuple[str, str]] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Kept:
    """Keep mode: a request's KV left on ``worker`` at its slice end (``blocks`` of it, since ``since``)."""

    worker: str
    since: float
    blocks: int


@dataclass
class CentralStats:
    """What the central loop did (the simulator's ``report["scls_central"]``)."""

    slice_end: SliceEnd = SLICE_END
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
        d["mean_batch_size"] = _mean(self.batch_sizes)
        d["mean_interval_s"] = _mean([t for _, t in self.intervals])
        d["mean_pool"] = _mean(self.pool_sizes)
        for k in ("intervals", "pool_sizes", "batch_sizes"):
            del d[k]
        return d


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


@dataclass(frozen=True)
class SclsCentralOptions:
    """The central policy's options (see the module docstring): ``slice_end`` (recompute, the paper, or
    keep); ``cost`` prices a batch's serving time (T_serve, a :class:`SliceCost` or its mapping);
    ``slice_iterations`` is the slice length S; ``lam`` (λ) and ``gamma_s`` (Γ) give the interval
    T = max(λ·min load, Γ) (Eq. 12); ``zeta`` (ζ) is the share of a worker's usable KV blocks a batch may
    reserve (Eq. 9); ``max_prefill_tokens`` bounds a batch's padded prefill n·L (None: unbounded, the
    paper); ``keep_affinity`` (keep mode) credits a worker with the prefill its kept KV saves;
    ``oversized`` says what becomes of a request whose padded single row fits no worker ("fail" or
    "alone"); ``series`` keeps the per-tick series in the stats (a long-running scheduler keeps none)."""

    slice_end: SliceEnd = SLICE_END
    cost: SliceCost | Mapping[str, Any] | None = None
    slice_iterations: int = 128
    lam: float = 0.5
    gamma_s: float = GAMMA_HF_S
    zeta: float = 0.9
    max_prefill_tokens: int | None = None
    keep_affinity: bool = False
    oversized: str = "fail"
    series: bool = True

    def __post_init__(self) -> None:
        if self.slice_end not in SLICE_END_MODES:
            raise ValueError(f"slice_end must be one of {SLICE_END_MODES}, got {self.slice_end!r}")
        if self.keep_affinity and self.slice_end != "keep":
            raise ValueError("keep_affinity needs slice_end='keep'")
        if not (isinstance(self.zeta, int | float) and 0 < self.zeta <= 1):
            raise ValueError(f"zeta must be in (0, 1], got {self.zeta!r}")
        positive_int("max_prefill_tokens", self.max_prefill_tokens, optional=True)
        if self.oversized not in OVERSIZED:
            raise ValueError(f"oversized must be one of {OVERSIZED}, got {self.oversized!r}")
        SclsMaxMinOptions(self.cost, self.slice_iterations, self.lam, self.gamma_s)  # checks these four


class SclsCentralPolicy:
    """The pool, the DP per tick, the max-min books and (keep mode) the kept KV; see the module docstring."""

    Options: ClassVar[type[SclsCentralOptions]] = SclsCentralOptions

    def __init__(self, options: SclsCentralOptions | None = None) -> None:
        o = options if options is not None else SclsCentralOptions()
        self.maxmin = SclsMaxMin(SclsMaxMinOptions(o.cost, o.slice_iterations, o.lam, o.gamma_s))
        self.cost = self.maxmin.cost
        self.s = o.slice_iterations
        self.slice_end = o.slice_end
        self.zeta = float(o.zeta)
        self.max_prefill_tokens = o.max_prefill_tokens
        self.keep_affinity = o.keep_affinity
        self.oversized = o.oversized
        self.series = o.series
        self.pool: dict[str, PoolEntry] = {}
        self.kept: dict[str, Kept] = {}
        self.stats = CentralStats(o.slice_end, o.slice_iterations)
        self._outstanding: dict[CentralBatch, int] = {}  # members not back yet (member_back)
        self._seq = 0

    # ------------------------------------------------------------------------------------------ pool
    def add(self, entry: PoolEntry) -> None:
        """``entry`` enters the pool (an arrival, or a request back for its next slice)."""
        self.pool[entry.request_id] = entry
        self.stats.max_pool = max(self.stats.max_pool, len(self.pool))

    def remove(self, request_id: str) -> PoolEntry | None:
        """A request left the pool (withdrawn, or failed by the driver); None when it was not there."""
        return self.pool.pop(request_id, None)

    def fail(self, request_id: str) -> PoolEntry | None:
        """The driver fails a pooled request (e.g. its model has no worker): out of the pool, counted."""
        e = self.pool.pop(request_id, None)
        if e is not None:
            self.stats.failed += 1
        return e

    def waiting(self) -> dict[str, int]:
        """Per model: requests in the pool."""
        out: dict[str, int] = {}
        for e in self.pool.values():
            out[e.model] = out.get(e.model, 0) + 1
        return out

    # ------------------------------------------------------------------------------------------ tick
    def plan(self, workers_for: Callable[[str], Sequence[WorkerView]], max_rows: int) -> TickPlan:
        """One tick: partition each model's pooled requests (oldest model first, requests in arrival
        order) and offload the batches max-min to ``workers_for(model)``; batches hold at most
        ``max_rows`` rows. Offloaded members leave the pool."""
        st = self.stats
        st.ticks += 1
        if self.series:
            st.pool_sizes.append(len(self.pool))
        by_model: dict[str, list[PoolEntry]] = {}
        for e in sorted(self.pool.values(), key=lambda e: (e.arrival_s, e.request_id)):
            by_model.setdefault(e.model, []).append(e)
        out = TickPlan()
        seen: dict[str, None] = {}
        for model, entries in by_model.items():
            workers = list(workers_for(model))
            if not workers:
                out.unserved[model] = entries
                continue
            names = [w.worker_id for w in workers]
            seen.update(dict.fromkeys(names))
            batches = self._partition(model, entries, workers, max_rows, out)
            credit = self._credit if self.keep_affinity else None
            for b, w in self.maxmin.assign_batches([(b, b.estimate_s) for b in batches], names, credit):
                out.assigned.append(self._offload(b, w, out))
        out.workers = list(seen)
        return out

    def _offload(self, b: CentralBatch, worker: str, out: TickPlan) -> Offload:
        st = self.stats
        st.batches += 1
        st.offloaded_rows += len(b.request_ids)
        if self.series:
            st.batch_sizes.append(len(b.request_ids))
        st.max_padded_prefill_tokens = max(st.max_padded_prefill_tokens, len(b.request_ids) * b.padded_len)
        self._outstanding[b] = len(b.request_ids)
        entries = []
        for rid in b.request_ids:
            entries.append(self.pool.pop(rid))
            held = self.kept.get(rid)
            if held is not None and held.worker != worker:  # batched elsewhere: re-prefill there
                out.freed.append(self._free(rid))
                st.keep_misses += 1
        return Offload(b, worker, tuple(entries))

    def _partition(
        self,
        model: str,
        entries: list[PoolEntry],
        workers: Sequence[WorkerView],
        max_rows: int,
        out: TickPlan,
    ) -> list[CentralBatch]:
        """Algorithm 1 over ``entries`` (arrival order): batches with their T_serve estimates."""
        known = [w for w in workers if w.kv_blocks is not None]
        small = min(known, key=lambda w: w.kv_blocks or 0) if known else None
        usable = small.kv_blocks if small is not None else None
        budget = math.floor(self.zeta * usable) if usable is not None else None
        tpb = small.tokens_per_block if small is not None else 1
        s, cap, cost = self.s, self.max_prefill_tokens, self.cost

        def blocks(n: int, length: int) -> int:
            return n * -(-(length + s) // tpb)

        def fits(n: int, length: int) -> bool:
            return (
                n <= max_rows
                and (budget is None or blocks(n, length) <= budget)
                and (cap is None or n * length <= cap)
            )

        runnable, alone = [], []
        for e in entries:
            if usable is None or not self._oversized(e.input_len, tpb, usable):
                runnable.append(e)
            elif self.oversized == "alone":
                alone.append(e)
            else:
                out.failed.append((e, self._fail_oversized(e, tpb, usable)))
                if e.request_id in self.kept:
                    out.freed.append(self._free(e.request_id))
        lengths = [e.input_len for e in runnable]
        groups = [
            [runnable[k] for k in g] for g in dp_batches(lengths, lambda n, ln: cost.t_serve(n, ln, s), fits)
        ]
        if alone:  # after the DP's batches, in pool order
            order = {rid: k for k, rid in enumerate(self.pool)}
            groups += [[e] for e in sorted(alone, key=lambda e: order[e.request_id])]
        return [self._batch(model, g) for g in groups]

    def _oversized(self, length: int, tpb: int, usable: int) -> bool:
        """One row of ``length`` cannot fit a worker: with a whole slice ("fail") or even one token ("alone")."""
        new = self.s if self.oversized == "fail" else 1
        return -(-(length + new) // tpb) > usable

    def _fail_oversized(self, e: PoolEntry, tpb: int, usable: int) -> str:
        self.pool.pop(e.request_id, None)
        self.stats.failed += 1
        return (
            f"input of {e.input_len} tokens + a slice of {self.s} needs {-(-(e.input_len + self.s) // tpb)} KV "
            f"blocks; a worker has {usable}"
        )

    def _batch(self, model: str, members: list[PoolEntry]) -> CentralBatch:
        self._seq += 1
        longest = max(e.input_len for e in members)
        est = float(self.cost.t_serve(len(members), longest, self.s))
        return CentralBatch(self._seq, model, tuple(e.request_id for e in members), longest, est)

    def _credit(self, b: CentralBatch, worker: str) -> float:
        """keep_affinity: the prefill a batch skips on ``worker`` (its rows kept there), estimated as
        T_serve(k, L, 0) = T_prefill(k, L) of those k rows padded to the batch's length."""
        k = sum(1 for rid in b.request_ids if (h := self.kept.get(rid)) is not None and h.worker == worker)
        return float(self.cost.t_serve(k, b.padded_len, 0)) if k else 0.0

    def interval(self, workers: Iterable[str], now: float | None = None) -> float:
        """Eq. 12 over ``workers`` (Γ when there are none); recorded in the stats when ``now`` is given."""
        t = self.maxmin.interval(workers)
        if now is not None and self.series:
            self.stats.intervals.append((now, t))
        return t

    # ------------------------------------------------------------------------------------ batch ends
    def batch_done(self, batch: CentralBatch) -> None:
        """The worker finished ``batch``: its load drops by the batch's estimate."""
        self._outstanding.pop(batch, None)
        self.maxmin.complete_batch(batch)
        self.stats.batches_done += 1

    def member_back(self, batch: CentralBatch) -> None:
        """One member's slice ended (any outcome): the batch is done once every member is back."""
        left = self._outstanding.get(batch, 0) - 1
        if left > 0:
            self._outstanding[batch] = left
        else:
            self.batch_done(batch)

    # ------------------------------------------------------------------------------ keep mode (KV)
    def start_batch(
        self, off: Offload, free_blocks: int, tokens_per_block: int
    ) -> tuple[set[str], list[tuple[str, str]]]:
        """``off`` starts on its worker with ``free_blocks`` free: (rows that skip their prefill, their KV
        kept there; kept copies to free: those rows' and the ones evicted for the batch's padded reservation)."""
        if self.slice_end != "keep":
            return set(), []
        b, w = off.batch, off.worker
        skip = {rid for rid in b.request_ids if (h := self.kept.get(rid)) is not None and h.worker == w}
        freed = []
        for rid in b.request_ids:
            if rid in skip:
                free_blocks += self.kept[rid].blocks
                freed.append(self._free(rid))
                self.stats.keep_hits += 1
        need = len(b.request_ids) * -(-(b.padded_len + self.s) // tokens_per_block)
        return skip, freed + self._make_room(w, need, free_blocks)[0]

    def slice_returned(
        self, entry: PoolEntry, worker: str, now: float, need_blocks: int = 0, free_blocks: int = 0
    ) -> tuple[bool, list[tuple[str, str]]]:
        """An unfinished row of ``worker``'s batch is back in the pool. Keep mode: (keep its KV there,
        ``need_blocks`` of it; kept copies to free first). Recompute: (False, [])."""
        self.add(entry)
        self.stats.returns += 1
        if self.slice_end != "keep":
            return False, []
        freed, free_blocks = self._make_room(worker, need_blocks, free_blocks)
        if free_blocks < need_blocks:
            self.stats.kept_dropped += 1
            return False, freed
        self.kept[entry.request_id] = Kept(worker, now, need_blocks)
        return True, freed

    def _make_room(self, worker: str, need: int, free: int) -> tuple[list[tuple[str, str]], int]:
        """Evict ``worker``'s kept KV, oldest first, until ``need`` blocks are free: (evicted, free after)."""
        out: list[tuple[str, str]] = []
        if free >= need:
            return out, free
        mine = sorted((k.since, rid) for rid, k in self.kept.items() if k.worker == worker)
        for _, rid in mine:
            if free >= need:
                break
            free += self.kept[rid].blocks
            out.append(self._free(rid))
            self.stats.kept_evicted += 1
        return out, free

    def _free(self, rid: str) -> tuple[str, str]:
        return rid, self.kept.pop(rid).worker


def make_central_policy(mode: str, options: Mapping[str, Any]) -> SclsCentralPolicy:
    """The policy of central mode ``mode`` with its options record built from ``options`` (a ValueError
    naming an unknown mode or a bad option)."""
    return instantiate("central", {MODE: SclsCentralPolicy}, mode, options)
