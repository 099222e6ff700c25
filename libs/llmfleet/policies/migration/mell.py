"""Mell: online KV-cache bin packing with migration (Mell §VI-C, Fig. 10, Algorithm 1; §VII).

Each epoch :class:`MellPacker` diffs the observed per-request KV state against its own view of the
last epoch: a request that vanished is a Depart, a new one an Allocate, a class change an Update
(classes in :mod:`mell_classes`). With operation batching (§VI-C) all Departs run first, then Updates,
then Allocates; their migrations are buffered, and chains A→B→C become A→C, round trips A→B→A and moves
of finished requests go. One operation makes at most 10 item moves (Theorem 3); a general overload
check (growth inside a class) evicts T items first. A GPU is opened by taking an empty one that hosts
the model and closed when it ends an epoch empty. The operations themselves run on one epoch's
:class:`~llmfleet.policies.migration.mell_work.EpochWork`. :func:`allocate_target` (:mod:`mell_view`)
answers where Allocate puts a new item, from a :class:`MellView` (``dispatch/mell.py`` sends arrivals
there); it and the packer run the same rule (``mell_classes.choose``), so a request dispatched there is
not moved again.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from llmfleet.policies.migration.base import EpochPlan, GpuState, Migration, RequestState, migration_id
from llmfleet.policies.migration.mell_classes import TINY, Item, pack_bundles, reference_capacity, size_class
from llmfleet.policies.migration.mell_view import MellGpu, MellView, allocate_target
from llmfleet.policies.migration.mell_work import EpochWork

__all__ = ["MAX_MOVES_PER_OP", "MellGpu", "MellOptions", "MellPacker", "MellView", "allocate_target"]

MAX_MOVES_PER_OP = 10  # Theorem 3: at most ten migrations per operation
REPLAN_EPOCHS = 3  # for how many epochs a planned move not yet done is planned again


class _Prev(NamedTuple):
    """An item as last planned: its GPU, class, model and requests (with their sizes then)."""

    gpu: str
    cls: str
    model: str
    reqs: tuple[RequestState, ...]
    bundle: bool


@dataclass(frozen=True)
class MellOptions:
    """The packer's options. ``batching``: operation batching (§VI-C); off, operations run in
    request-id order and every move they make is kept (a benchmark baseline). ``max_moves_per_op``:
    the item moves one operation may make (Theorem 3's ten). ``fill_first`` (beyond the paper, off by
    default): before Allocate opens a GPU, the item goes to an active GPU with room of any type
    (``mell_classes.choose``); the view carries it to dispatch. ``compact`` (beyond the paper, off by
    default): after the operations, empty one GPU per epoch into the others' room, keeping
    ``compact_headroom`` × C free on each (``EpochWork.compact``)."""

    batching: bool = True
    max_moves_per_op: int = MAX_MOVES_PER_OP
    fill_first: bool = False
    compact: bool = False
    compact_headroom: float = 0.05

    def __post_init__(self) -> None:
        if isinstance(self.max_moves_per_op, bool) or not (
            isinstance(self.max_moves_per_op, int) and self.max_moves_per_op >= 1
        ):
            raise ValueError(f"max_moves_per_op must be an int >= 1, got {self.max_moves_per_op!r}")
        if not 0 <= self.compact_headroom < 1:
            raise ValueError(f"compact_headroom must be in [0, 1), got {self.compact_headroom}")


class MellPacker:
    """Mell's online scheduler (Algorithm 1) as a :class:`MigrationPolicy` with ``options``; keeps GPU
    types, activation order, multi-items and last epoch's plan between epochs."""

    name = "mell"
    Options: ClassVar[type[MellOptions]] = MellOptions

    def __init__(self, options: MellOptions | None = None) -> None:
        o = options if options is not None else MellOptions()
        self.batching = o.batching
        self.fill_first = o.fill_first
        self.compact = o.compact
        self.compact_headroom = o.compact_headroom
        self.max_moves_per_op = o.max_moves_per_op
        self._epoch = 0
        self._seq = 0
        self._cap = 0
        self._bundles = 0
        self._meta: dict[str, tuple[str, int]] = {}  # gpu -> (type, activation sequence number)
        self._items: dict[str, _Prev] = {}  # item id -> the item as last planned
        self._pending: dict[str, tuple[Migration, int]] = {}  # request -> (planned move, epoch first planned)
        self._op_moves: tuple[int, ...] = ()
        self._view = MellView(fill_first=o.fill_first)
        self._active_end: set[str] = set()  # GPUs holding items at the end of the last epoch's plan
        self._openings: Counter[str] = Counter()

    @property
    def last_op_moves(self) -> tuple[int, ...]:
        """Item moves made by each operation of the last epoch (before batching cancelled any)."""
        return self._op_moves

    def counters(self) -> dict[str, int]:
        """GPU openings since the start, by cause. ``opened_arrival``: a GPU the last plan left empty
        that reports requests at an epoch (dispatch placed arrivals there); ``opened_<operation>``: an
        empty GPU an operation (``allocate``, ``update``, ``depart``, ``overload``, ``compact``) moved an
        item into, still holding items at the epoch's end (planned moves, before operation batching).
        ``room_<cause>``: of those, openings while another active GPU hosting the model had room for
        one of the requests (the arrival's, or the first item moved in)."""
        return dict(sorted(self._openings.items()))

    def view(self) -> MellView:
        """The read-only view dispatch uses (:func:`allocate_target`), as of the last epoch."""
        return self._view

    def epoch(self, gpus: Sequence[GpuState], now: float) -> EpochPlan:
        del now
        self._epoch += 1
        self._cap = reference_capacity(g.capacity_bytes for g in gpus) or self._cap
        if self._cap <= 0:
            return EpochPlan(notes=("no GPU reports a KV capacity: nothing planned",))
        w = EpochWork(self._cap, gpus, self._meta, self._seq, self.max_moves_per_op)
        w.new_bundle = self._new_bundle
        w.fill_first = self.fill_first
        seen = self._observe(w, gpus)
        self._count_arrival_openings(gpus)
        reissued = self._reissue(w, seen)
        ops = self._build(w, seen)
        for _, _, name, fn, args in sorted(
            ops, key=lambda o: (o[0], o[1]) if self.batching else (0, o[1][-1])
        ):
            w.run(name, fn, *args)
        w.repair()
        if self.compact:
            w.compact(self.compact_headroom)
        for b in w.bins.values():
            w.retype(b, force=True)
        return self._finish(w, gpus, seen, reissued)

    # ---------------------------------------------------------------- epoch steps
    def _count_arrival_openings(self, gpus: Sequence[GpuState]) -> None:
        """GPUs the last plan left empty that now report requests: dispatch opened them."""
        free = {
            g.gpu_id: (g.capacity_bytes - g.used_bytes, g.models)
            for g in gpus
            if g.gpu_id in self._active_end
        }
        for g in gpus:
            if not g.requests or g.gpu_id in self._active_end:
                continue
            self._openings["opened_arrival"] += 1
            small = min(r.kv_bytes for r in g.requests)
            room = any(left >= small and set(models) & set(g.models) for left, models in free.values())
            self._openings["room_arrival"] += room

    def _new_bundle(self) -> str:
        self._bundles += 1
        return f"bundle:{self._bundles}"

    @staticmethod
    def _observe(w: EpochWork, gpus: Sequence[GpuState]) -> dict[str, tuple[RequestState, str]]:
        seen: dict[str, tuple[RequestState, str]] = {}
        for g in sorted(gpus, key=lambda g: g.gpu_id):
            for r in g.requests:
                if r.request_id in seen:
                    w.notes.append(
                        f"{r.request_id} reported on {seen[r.request_id][1]} and {g.gpu_id}: kept the first"
                    )
                else:
                    seen[r.request_id] = (r, g.gpu_id)
        return seen

    def _reissue(
        self, w: EpochWork, seen: dict[str, tuple[RequestState, str]]
    ) -> dict[tuple[str, str, str], tuple[str, int]]:
        """Planned moves not done yet (deferred) are planned again, under their first id, for up to
        :data:`REPLAN_EPOCHS` epochs while their destination still serves requests and has room. Returns
        reissued move -> (migration id, epoch first planned)."""
        used: dict[str, int] = defaultdict(int)
        for r, gid in seen.values():
            used[gid] += r.kv_bytes
        reissued: dict[tuple[str, str, str], tuple[str, int]] = {}
        for rid, (mig, first) in sorted(self._pending.items()):
            if rid not in seen or self._epoch - first > REPLAN_EPOCHS:
                continue
            r, at = seen[rid]
            dst = w.bins.get(mig.destination)
            if at != mig.source or dst is None or r.served_as not in dst.models or not used[dst.gpu_id]:
                continue
            if dst.capacity - used[dst.gpu_id] >= r.kv_bytes:
                used[at] -= r.kv_bytes
                used[dst.gpu_id] += r.kv_bytes
                seen[rid] = (r, dst.gpu_id)
                reissued[(rid, at, dst.gpu_id)] = (mig.migration_id, first)
                w.moves.append((rid, at, dst.gpu_id))
        return reissued

    def _build(self, w: EpochWork, seen: dict[str, tuple[RequestState, str]]) -> list[tuple]:
        """Place items (multi-items kept and normalised) and list the operations: Departs, Updates,
        Allocates (Algorithm 1's diff of this epoch against the last)."""
        cap = self._cap
        prev_of = {r.request_id: iid for iid, p in self._items.items() for r in p.reqs}
        ops: list[tuple] = []
        tiny: dict[tuple[str, str], tuple[dict[str, list], list]] = {}
        for rid, (r, gid) in seen.items():
            b, pid = w.bins[gid], prev_of.get(rid)
            if pid is not None and size_class(r.kv_bytes, cap) == TINY:
                groups, loose = tiny.setdefault((gid, r.served_as), ({}, []))
                prev = self._items[pid]
                (groups.setdefault(pid, []) if prev.bundle else loose).append((rid, r.kv_bytes))
                continue
            w.attach(Item(rid, r.served_as, {rid: r}, False, cap), b)  # an adapter's: where it is served
            if pid is None:
                ops.append((2, (-r.kv_bytes, rid), "allocate", w.allocate_op, (rid,)))
            elif (old := self._items[pid].cls) != w.at[rid].items[rid].cls:
                ops.append((1, (rid,), "update", w.update_op, (rid, old)))
        seen_on: dict[str, list[str]] = defaultdict(list)  # a multi-item split by a deferred move
        for (gid, _), (groups, _) in sorted(tiny.items()):
            for pid in groups:
                seen_on[pid].append(gid)
        for (gid, model), (groups, loose) in sorted(tiny.items()):
            named = []
            for pid, members in sorted(groups.items()):
                home = self._items[pid].gpu if self._items[pid].gpu in seen_on[pid] else seen_on[pid][0]
                named.append((pid if home == gid else None, members))
            for bid, members in pack_bundles(named, loose, cap):
                reqs = {rid: seen[rid][0] for rid, _ in members}
                w.attach(Item(bid or self._new_bundle(), model, reqs, True, cap), w.bins[gid])
        shrunk: set[str] = set()
        for iid, p in sorted(self._items.items()):  # finished items stay (as last seen) until their Depart
            j, alive = w.bins.get(p.gpu), sum(r.request_id in seen for r in p.reqs)
            if j is not None and not alive:
                w.attach(Item(iid, p.model, {r.request_id: r for r in p.reqs}, p.bundle, cap), j)
                w.ghosts.update(r.request_id for r in p.reqs)
                ops.append((0, (iid,), "depart", w.depart_op, (iid, p.cls)))
            elif j is not None and alive < len(p.reqs):
                shrunk.add(p.gpu)
        ops.extend((0, (gid,), "depart", w.shrink_op, (gid,)) for gid in sorted(shrunk))
        for b in w.bins.values():
            if b.n and b.kind is None:
                w.retype(b, force=True)
        return ops

    def _finish(
        self,
        w: EpochWork,
        gpus: Sequence[GpuState],
        seen: dict[str, tuple[RequestState, str]],
        reissued: dict[tuple[str, str, str], tuple[str, int]],
    ) -> EpochPlan:
        """Batch the buffered moves (compose chains A→B→C into A→C, drop round trips and moves of finished
        requests), order them so each lands where there is room when possible, remember the plan."""
        reqs = {rid: r for rid, (r, _) in seen.items()}
        live = [mv for mv in w.moves if mv[0] not in w.ghosts]
        first: dict[str, str] = {}
        last: dict[str, str] = {}
        for rid, src, dst in live:
            first.setdefault(rid, src)
            last[rid] = dst
        notes = list(w.notes)
        if self.batching:
            moves = [(rid, first[rid], last[rid]) for rid in first if first[rid] != last[rid]]
            cancelled = len(w.moves) - len(moves)
        else:  # no cancellation; a finished request cannot be moved, though
            moves, cancelled = live, 0
            if len(live) < len(w.moves):
                notes.append(f"{len(w.moves) - len(live)} move(s) of finished requests skipped")
        migs: list[Migration] = []
        ids: set[str] = set()
        self._pending = {}
        for rid, src, dst in moves:
            mid, first_epoch = reissued.get((rid, src, dst)) or (
                migration_id(rid, src, dst, self._epoch),
                self._epoch,
            )
            mid = mid if mid not in ids else f"{mid}/{len(ids)}"
            ids.add(mid)
            r = reqs[rid]
            migs.append(Migration(mid, rid, r.model, src, dst, r.kv_bytes, r.tokens))
            if (first[rid], last[rid]) == (src, dst):
                self._pending[rid] = (migs[-1], first_epoch)
        used = {g.gpu_id: g.used_bytes for g in gpus}
        migs = _feasible_order(migs, used, {g.gpu_id: g.capacity_bytes for g in gpus})
        bins = w.bins.values()
        self._seq = w.seq
        self._meta = {b.gpu_id: (b.kind, b.seq) for b in bins if b.n and b.kind}
        self._items = {
            iid: _Prev(b.gpu_id, it.cls, it.model, tuple(it.reqs.values()), it.bundle)
            for iid, b in w.at.items()
            for it in (b.items[iid],)
        }
        self._op_moves = tuple(w.op_moves)
        self._active_end = {b.gpu_id for b in bins if b.n}
        for gid, cause in w.filled_by.items():
            if w.bins[gid].n:
                self._openings[f"opened_{cause}"] += 1
                self._openings[f"room_{cause}"] += gid in w.room_elsewhere
        self._view = MellView(
            self._cap,
            tuple(MellGpu(g, k, q) for g, (k, q) in sorted(self._meta.items())),
            self._seq,
            self.fill_first,
        )
        return EpochPlan(
            migrations=tuple(migs),
            activate=tuple(b.gpu_id for b in bins if b.n and not b.was_active),
            deactivate=tuple(b.gpu_id for b in bins if not b.n and b.was_active),
            operations=len(w.op_moves),
            cancelled=cancelled,
            notes=tuple(notes),
        )


def _feasible_order(migs: list[Migration], used: dict[str, int], caps: dict[str, int]) -> list[Migration]:
    """Execution order: each request's moves in turn; among the next moves, the first whose destination
    has room then (so moves out of a GPU run before moves into it); a cycle runs in plan order."""
    left, out = list(migs), []
    while left:
        heads: set[str] = set()
        pick = 0
        for k, m in enumerate(left):
            if m.request_id in heads:
                continue
            heads.add(m.request_id)
            if used.get(m.destination, 0) + m.kv_bytes <= caps.get(m.destination, 0):
                pick = k
                break
        m = left.pop(pick)
        used[m.source] = used.get(m.source, 0) - m.kv_bytes
        used[m.destination] = used.get(m.destination, 0) + m.kv_bytes
        out.append(m)
    return out
