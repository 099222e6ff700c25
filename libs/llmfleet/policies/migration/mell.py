"""Mell: online KV-cache bin packing with migration (Mell §VI-C, Fig. 10, Algorithm 1; §VII).

Each epoch :class:`MellPacker` diffs the observed per-request KV state against its own view of the
last epoch: a request that vanished is a Depart, a new one an Allocate, a class change an Update
(classes in :mod:`mell_classes`). With operation batching (§VI-C) all Departs run first, then Updates,
then Allocates; their migrations are buffered, and chains A→B→C become A→C, round trips A→B→A and moves
of finished requests go. One operation makes at most 10 item moves (Theorem 3); a general overload
check (growth inside a class) evicts T items first. A GPU is opened by taking an empty one that hosts
the model and closed when it ends an epoch empty. :func:`allocate_target` answers where Allocate puts
a new item, from a :class:`MellView` (``dispatch/mell.py`` sends arrivals there); it and the packer run
the same rule (``mell_classes.choose``), so a request dispatched there is not moved again.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from llmfleet.policies.migration.base import EpochPlan, GpuState, Migration, RequestState, migration_id
from llmfleet.policies.migration.mell_classes import (
    RANK,
    TINY,
    Bin,
    Item,
    L,
    M,
    S,
    T,
    choose,
    fits_bundle,
    item_class,
    most_recent,
    pack_bundles,
    reference_capacity,
    size_class,
)

MAX_MOVES_PER_OP = 10  # Theorem 3: at most ten migrations per operation


@dataclass(frozen=True)
class MellGpu:
    """One non-empty GPU in the packer's view: its type (L/M/S/T) and activation sequence number."""

    gpu_id: str
    kind: str
    seq: int


@dataclass(frozen=True)
class MellView:
    """What dispatch needs of the packer (read-only): GPU types with their activation order and C.
    ``next_seq``: sequence numbers below it are taken (a GPU opened since counts as most recent).
    ``fill_first``: the packer's option of that name (dispatch then places as the packer would).

    ``opened``: the GPUs :func:`allocate_target` opened on this view (since the packer's last epoch),
    with the class of the item that opened each and the order of opening: such a GPU has that type
    (Fig. 10: Allocate opens a GPU for an item, which gives its type), whatever its KV adds up to. A
    memo, not state: it is neither compared nor serialised (a view read back from JSON starts empty)."""

    capacity_bytes: int = 0
    gpus: tuple[MellGpu, ...] = ()
    next_seq: int = 0
    fill_first: bool = False
    opened: dict[str, tuple[str, int]] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def by_id(self) -> dict[str, MellGpu]:
        return {g.gpu_id: g for g in self.gpus}

    def to_json(self) -> dict[str, Any]:
        """A JSON object (what the coordinator embeds in ``migration_state``)."""
        gpus = [[g.gpu_id, g.kind, g.seq] for g in self.gpus]
        out: dict[str, Any] = {"capacity_bytes": self.capacity_bytes, "next_seq": self.next_seq, "gpus": gpus}
        if self.fill_first:
            out["fill_first"] = True
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str | bytes) -> MellView:
        """From :meth:`to_json`'s object, or that object as JSON text."""
        d = json.loads(data) if isinstance(data, str | bytes) else data
        gpus = tuple(MellGpu(str(i), str(k), int(s)) for i, k, s in d.get("gpus", ()))
        return cls(
            int(d.get("capacity_bytes", 0)), gpus, int(d.get("next_seq", 0)), bool(d.get("fill_first", False))
        )


def allocate_target(
    view: MellView | None,
    gpus: Sequence[GpuState],
    model: str,
    kv_bytes: int,
    *,
    source: str | None = None,
    fill_first: bool | None = None,
) -> str | None:
    """Where Allocate (Fig. 10) puts a new item of ``kv_bytes`` of ``model``: an active GPU, or an empty
    one to open; best fit when none can be opened; None when nothing hosting ``model`` fits. GPU types
    and activation order come from ``view``; a GPU this function opened on ``view`` has the class of
    the item it opened it for (``view.opened``; the most recent of its type, later openings more
    recent), so its KV, which a dispatcher reports as one sum, does not retype it; any other non-empty
    GPU it does not know, or whose largest request is now below its type, is typed by its largest
    request and counts as the most recent of its type. Requests listed on an L-GPU that are T items
    count as room for an S/M item (they would make way). ``source``: the GPU the item sits on
    (preferred when opening; same machine ranks higher). ``fill_first``: see ``choose`` (None: the
    view's)."""
    cap = (view.capacity_bytes if view else 0) or reference_capacity(g.capacity_bytes for g in gpus)
    if cap <= 0:
        return None
    known = view.by_id if view else {}
    memo = view.opened if view is not None else {}
    fresh = view.next_seq if view else 0
    hosts: list[Bin] = []
    for g in sorted(gpus, key=lambda g: g.gpu_id):
        if model not in g.models or g.capacity_bytes <= 0:
            continue
        b = Bin(g)
        for r in g.requests:
            b.add(Item(r.request_id, r.model, {r.request_id: r}, False, cap))
        mg, kind, mine = known.get(g.gpu_id), b.content_kind(), memo.get(g.gpu_id)
        if mine is not None and kind is not None and RANK[kind] >= RANK[mine[0]]:
            b.kind, b.seq = mine[0], fresh + len(gpus) + mine[1]  # opened here since the view
        elif mg is not None and kind is not None and RANK[kind] >= RANK.get(mg.kind, 0):
            b.kind, b.seq = mg.kind, mg.seq
        elif kind is not None:  # opened since the view, or its type-giving item left since
            b.kind, b.seq = kind, fresh + len(hosts)
        hosts.append(b)
    src = next((b for b in hosts if b.gpu_id == source), None)
    cls = item_class(kv_bytes, cap)
    if fill_first is None:
        fill_first = view.fill_first if view is not None else False
    target, opened = choose(cls, kv_bytes, hosts, src, fill_first=fill_first)
    if target is None:
        return None
    if opened and view is not None:
        memo[target.gpu_id] = (cls, len(memo))
    return target.gpu_id


class _Prev(NamedTuple):
    """An item as last planned: its GPU, class, model and requests (with their sizes then)."""

    gpu: str
    cls: str
    model: str
    reqs: tuple[RequestState, ...]
    bundle: bool


@dataclass
class _Op:
    """One operation in progress: its moves so far, and each touched GPU's type and place before it."""

    name: str
    moves: int = 0
    start: dict[str, tuple[str | None, int]] = field(default_factory=dict)


class _Work:
    """One epoch's working state: bins, where each item is, the buffer of moves, the operation context.
    Operations (Fig. 10) are methods; every move is fit-checked, so a refused move leaves the item put."""

    def __init__(
        self, cap: int, gpus: Sequence[GpuState], meta: dict[str, tuple[str, int]], seq: int, limit: int
    ):
        self.cap, self.seq, self.limit = cap, seq, limit
        self.fill_first = False  # MellPacker's option (see mell_classes.choose)
        self.bins: dict[str, Bin] = {}
        self.hosts: dict[str, list[Bin]] = defaultdict(list)
        self.at: dict[str, Bin] = {}  # item id -> the bin holding it
        self.moves: list[tuple[str, str, str]] = []  # (request, source, destination), in order
        self.op: _Op | None = None
        self.op_moves: list[int] = []
        self.notes: list[str] = []
        self.new_bundle: Callable[[], str] = lambda: ""
        self.ghosts: set[str] = set()  # finished requests, present until their Depart runs
        for g in sorted(gpus, key=lambda g: g.gpu_id):
            b = self.bins[g.gpu_id] = Bin(g)
            b.kind, b.seq = meta.get(g.gpu_id, (None, -1))
            for m in g.models if g.capacity_bytes > 0 else ():
                self.hosts[m].append(b)

    # ---------------------------------------------------------------- primitives
    def attach(self, it: Item, b: Bin) -> None:
        self._touch(b)
        b.add(it)
        self.at[it.item_id] = b
        self.retype(b)

    def detach(self, it: Item) -> Bin:
        b = self.at.pop(it.item_id)
        self._touch(b)
        b.remove(it)
        self.retype(b)
        return b

    def retype(self, b: Bin, force: bool = False) -> None:
        """A GPU's type is its largest item's class; a GPU that changes type is activated anew."""
        kind = b.content_kind()
        if (self.op is not None or force) and kind != b.kind:
            b.kind, b.seq = kind, self.seq if kind else -1
            self.seq += 1 if kind else 0

    def _touch(self, b: Bin) -> None:
        if self.op is not None:
            self.op.start.setdefault(b.gpu_id, (b.kind, b.seq))

    def run(self, name: str, fn: Callable[..., object], *args: object) -> None:
        """One operation: its moves count against the cap; a GPU whose type ends as it began keeps its
        place in the activation order."""
        self.op = _Op(name)
        fn(*args)
        for gid, (kind, seq) in self.op.start.items():
            b = self.bins[gid]
            self.retype(b)
            if b.kind == kind:
                b.seq = seq
        self.op_moves.append(self.op.moves)
        self.op = None

    def relocate(self, it: Item, src: Bin, dst: Bin) -> bool:
        """Put detached ``it`` on ``dst`` (a move unless ``dst`` is ``src``); refused (cap reached, no
        room, model not hosted) → back on ``src`` and False."""
        op = self.op
        refused = dst is not src and (
            op is None or op.moves >= self.limit or dst.free < it.size or it.model not in dst.models
        )
        if refused or dst is src:
            self.attach(it, src)
            return not refused
        assert op is not None
        self.attach(it, dst)
        op.moves += 1
        self.moves.extend((rid, src.gpu_id, dst.gpu_id) for rid in it.reqs)
        return True

    def is_recent(self, b: Bin, kind: str | None, model: str) -> bool:
        """Whether ``b`` is the most recently activated ``kind``-GPU among the hosts of ``model``."""
        return kind is not None and most_recent(self.hosts[model], kind) is b

    # ---------------------------------------------------------------- Fig. 10 building blocks
    def allocate(self, it: Item, src: Bin, avoid: Bin | None = None) -> Bin:
        """Allocate(i) for ``it``, detached from ``src``; returns where it ends. S/M onto an L-GPU makes
        that GPU's T items depart and re-allocate; an L item pulls one S/M request (Allocate 3)."""
        hosts = [b for b in self.hosts[it.model] if b is not avoid]
        dst, _ = choose(it.cls, it.size, hosts, src, fill_first=self.fill_first)
        if dst is None:
            self.attach(it, src)
            self.notes.append(
                f"no GPU hosting {it.model} can take {it.item_id} ({it.size} B); left on {src.gpu_id}"
            )
            return src
        if it.cls in (S, M) and dst.kind == L and dst is not src:
            tees = sorted((x for x in dst.items.values() if x.cls == T), key=lambda x: (-x.size, x.item_id))
            for x in tees:
                self.detach(x)
            ok = self.relocate(it, src, dst)
            for x in tees:
                self.allocate(x, dst)
            return dst if ok else src
        end = dst if self.relocate(it, src, dst) else src
        if it.cls == L and end.kind == L and not end.mid:
            self.pull_mid(end)
        return end

    def reallocate(self, j: Bin, items: list[Item]) -> None:
        """Depart and re-allocate ``items`` of ``j``, largest first (an emptied ``j`` is reopened in place)."""
        for x in items:
            self.detach(x)
        for x in sorted(items, key=lambda x: (-x.size, x.item_id)):
            self.allocate(x, j)

    def refill(self, j: Bin, cls: str, kinds: tuple[str, ...]) -> bool:
        """Move into ``j`` the largest ``cls`` item that fits from the most recently activated GPU of
        ``kinds`` (not ``j``) holding a ``cls`` item ``j`` hosts; for T, when no item fits, the largest
        tiny request that does leaves its multi-item. Whether anything moved."""
        src = max(
            (
                b
                for b in self.bins.values()
                if b is not j and b.n and b.kind in kinds
                and any(x.cls == cls and x.model in j.models for x in b.items.values())
            ),
            key=lambda b: b.seq,
            default=None,
        )  # fmt: skip
        if src is None:
            return False
        fit = [x for x in src.items.values() if x.cls == cls and x.model in j.models and x.size <= j.free]
        if fit:
            x = max(fit, key=lambda x: (x.size, x.item_id))
            self.detach(x)
            return self.relocate(x, src, j)
        parts = [
            (r.kv_bytes, rid, x)
            for x in src.items.values()
            if cls == T and x.bundle and x.model in j.models
            for rid, r in x.reqs.items()
            if r.kv_bytes <= j.free and len(x.reqs) > 1
        ]
        if not parts:
            return False
        _, rid, x = max(parts)
        self.detach(x)
        one = Item(self.new_bundle(), x.model, {rid: x.reqs.pop(rid)}, True, self.cap)
        self.attach(Item(x.item_id, x.model, x.reqs, True, self.cap), src)
        if not self.relocate(one, src, j):
            return False
        self.join_bundle(one, j)
        return True

    def shrink_op(self, gpu_id: str) -> None:
        """Tiny requests of a multi-item on ``gpu_id`` finished (the multi-item shrank; the paper's sizes
        only grow): refill with T items while the GPU is under 3/4 full (Theorem 1, properties 3 and 5)
        unless it is the most recent GPU of its type, as Depart of a T item does."""
        j = self.bins[gpu_id]
        self._touch(j)
        if not j.n or j.kind is None or any(self.is_recent(j, j.kind, m) for m in j.models):
            return
        while 4 * j.used < 3 * j.capacity and self.refill(j, T, (T, M) if j.kind == T else (T,)):
            pass

    def pull_mid(self, j: Bin) -> None:
        """Move into L-GPU ``j`` an S/M request from the S/M-GPU with the highest priority for ``j``
        (fewer requests, more idle memory, same machine), evicting ``j``'s T items if needed; then
        refill that GPU from the most recent GPU of its type (Fig. 10, Allocate 3 / Depart 3)."""
        best: tuple[tuple[int, int, bool, str], Bin, Item] | None = None
        for b in self.bins.values():
            if b is j or not b.n or b.kind not in (S, M):
                continue
            fit = [
                x
                for x in b.items.values()
                if x.cls in (S, M) and x.model in j.models
                and j.largest + x.size < j.capacity and x.size <= j.free + j.t_bytes
            ]  # fmt: skip
            key = (b.n, -b.free, b.machine != j.machine, b.gpu_id)
            if fit and (best is None or key < best[0]):
                best = (key, b, max(fit, key=lambda x: (x.size, x.item_id)))
        if best is None:
            return
        _, b, x = best
        kind, recent = b.kind, self.is_recent(b, b.kind, x.model)
        for t in sorted((t for t in j.items.values() if t.cls == T), key=lambda t: (-t.size, t.item_id)):
            if x.size <= j.free:
                break
            self.detach(t)
            self.allocate(t, j, avoid=j)
        self.detach(x)
        if self.relocate(x, b, j) and not recent and kind is not None:
            self.refill(b, kind, (kind,))

    # ---------------------------------------------------------------- operations
    def depart(self, j: Bin, cls: str, model: str, kind: str | None, recent: bool) -> None:
        """Depart (Fig. 10) of a ``cls`` item that left ``j`` (``j`` was a ``kind``-GPU, the most recent
        one if ``recent``: then nothing moves)."""
        if not j.n or kind is None or recent:
            return
        if cls == T:
            self.refill(j, T, (T, M) if kind == T else (T,))
        elif cls in (S, M) and kind in (S, M):
            self.refill(j, kind, (kind,))
            tees = [x for x in j.items.values() if x.cls == T]
            for x in tees:
                self.detach(x)
            for x in sorted(tees, key=lambda x: (-x.size, x.item_id)):
                self.allocate(x, j)
        elif cls in (S, M) and kind == L:
            self.pull_mid(j)
        elif cls == L:
            self.reallocate(j, list(j.items.values()))

    def depart_op(self, item_id: str, cls: str) -> None:
        """Depart (Fig. 10) of a finished item: it leaves the GPU it is on now, which is refilled."""
        j = self.at[item_id]
        it = j.items[item_id]
        self._touch(j)
        kind, recent = j.kind, self.is_recent(j, j.kind, it.model)
        self.detach(it)
        self.depart(j, cls, it.model, kind, recent)

    def update_op(self, item_id: str, old: str) -> None:
        """Update (Fig. 10) of an item whose class changed from ``old``: depart and re-allocate it; an
        item growing into the L of its own GPU keeps it (the others re-allocate if it overflows)."""
        j = self.at[item_id]
        it = j.items[item_id]
        others = [x for x in j.items.values() if x is not it]
        other_l = any(x.cls == L for x in others)
        self._touch(j)
        if it.cls == L and not other_l:  # j becomes an L-GPU
            self.retype(j)
            if j.used > j.capacity:
                self.reallocate(j, others)
            elif not j.mid:
                self.pull_mid(j)  # as Allocate L would (property 4)
            return
        if self.fits_here(it, j):
            return  # deviation: where Allocate could have put it (e.g. beside its L-GPU's L): no move
        kind, recent = j.kind, self.is_recent(j, j.kind, it.model)
        self.detach(it)
        if self.allocate(it, j) is not j:
            self.depart(j, old, it.model, kind, recent)

    def allocate_op(self, item_id: str) -> None:
        """Allocate (Fig. 10) of a new request: it stays where the dispatcher put it if Allocate could
        have put it there (an L still pulls an S/M request), else it is allocated anew; a tiny one then
        joins a multi-item where it lands."""
        end = self.at[item_id]
        it = end.items[item_id]
        if not self.fits_here(it, end):
            end = self.allocate(it, self.detach(it))
        elif it.cls == L and not end.mid:
            self.pull_mid(end)
        if size_class(it.size, self.cap) == TINY:
            self.join_bundle(it, end)

    @staticmethod
    def fits_here(it: Item, b: Bin) -> bool:
        """Whether ``it`` on ``b`` is a placement Allocate makes (in some order of arrivals): T beside an
        L or on a T-GPU; S/M as the one S/M of an L-GPU (S_L + S_i < C) or on a GPU of its own class;
        L as the only L; never on an overloaded GPU. Alone, Allocate decides (opening keeps it put)."""
        others = [x for x in b.items.values() if x is not it]
        top = max((x.cls for x in others), key=RANK.__getitem__, default=None)
        if b.used > b.capacity or top is None:
            return False
        if it.cls == L:
            return top != L
        if it.cls == T:
            return top in (L, T)
        if top == it.cls:
            return True
        big = max((x.size for x in others if x.cls == L), default=0)
        return top == L and not any(x.cls in (S, M) for x in others) and big + it.size < b.capacity

    def join_bundle(self, it: Item, b: Bin) -> None:
        self.detach(it)
        room = [
            x
            for x in b.items.values()
            if x.bundle and x.model == it.model and fits_bundle(x.size + it.size, self.cap)
        ]
        if room:
            x = max(room, key=lambda x: (x.size, x.item_id))
            self.detach(x)
            reqs = {**x.reqs, **it.reqs}
        else:
            x, reqs = None, dict(it.reqs)
        self.attach(Item(x.item_id if x else self.new_bundle(), it.model, reqs, True, self.cap), b)

    def repair(self) -> None:
        """The general overload check: growth inside a class can overflow a GPU. Evict T items first,
        then the others (never the largest while others remain): the smallest whose leaving ends the
        overload, else the largest of the tier; each eviction is an Allocate. Each run of up to 10
        moves is one operation."""
        for b in self.bins.values():
            stuck: set[str] = set()
            while b.used > b.capacity:
                self.run("overload", self._evict, b, stuck)
                if self.op_moves[-1] == 0:
                    self.notes.append(
                        f"{b.gpu_id} is over capacity ({b.used} > {b.capacity} B): no GPU can take more"
                    )
                    break

    def compact(self, headroom: float) -> None:
        """Beyond the paper (``MellPacker(compact=True)``): close one GPU per epoch when it can be
        emptied — the non-empty GPU with the least KV whose items (≤ the move cap) all fit, largest first
        and each on the fullest other non-empty GPU hosting its model where it fits and leaves
        ``headroom`` × C free (room for the next epoch's growth). One operation; whatever the types."""
        live = sorted((b for b in self.bins.values() if b.n), key=lambda b: (b.used, b.gpu_id))
        for b in live:
            items = sorted(b.items.values(), key=lambda x: (-x.size, x.item_id))
            if len(items) > self.limit:
                continue
            free = {o.gpu_id: o.free - int(headroom * o.capacity) for o in live if o is not b}
            plan: list[tuple[Item, Bin]] = []
            for x in items:
                fits = [
                    o for o in live if o.gpu_id in free and x.model in o.models and free[o.gpu_id] >= x.size
                ]
                if not fits:
                    break
                dst = min(fits, key=lambda o: (free[o.gpu_id] - x.size, o.gpu_id))
                free[dst.gpu_id] -= x.size
                plan.append((x, dst))
            if len(plan) == len(items):
                self.run("compact", self._empty, b, plan)
                return

    def _empty(self, b: Bin, plan: list[tuple[Item, Bin]]) -> None:
        for x, dst in plan:
            self.detach(x)
            self.relocate(x, b, dst)

    def _evict(self, b: Bin, stuck: set[str]) -> None:
        while b.used > b.capacity and self.op is not None and self.op.moves < self.limit:
            over = b.used - b.capacity
            top = max(b.items.values(), key=lambda x: (x.size, x.item_id))
            tiers = (
                [x for x in b.items.values() if x.cls == T and x.item_id not in stuck],
                [x for x in b.items.values() if x.cls != T and x is not top and x.item_id not in stuck],
                [top] if top.item_id not in stuck else [],
            )
            tier = next((t for t in tiers if t), None)
            if tier is None:
                return
            ends = [x for x in tier if x.size >= over]
            x = (
                min(ends, key=lambda x: (x.size, x.item_id))
                if ends
                else max(tier, key=lambda x: (x.size, x.item_id))
            )
            self.detach(x)
            if self.allocate(x, b, avoid=b) is b and self.op.moves < self.limit:
                stuck.add(x.item_id)


class MellPacker:
    """Mell's online scheduler (Algorithm 1) as a :class:`MigrationPolicy`; keeps GPU types, activation
    order, multi-items and last epoch's plan between epochs. ``batching``: operation batching (§VI-C);
    off, operations run in request-id order and every move they make is kept (a benchmark baseline).
    ``replan_epochs``: for how many epochs a planned move not yet done is planned again.
    ``fill_first`` (beyond the paper, off by default): before Allocate opens a GPU, the item goes to an
    active GPU with room of any type (``mell_classes.choose``); the view carries it to dispatch.
    ``compact`` (beyond the paper, off by default): after the operations, empty one GPU per epoch into
    the others' room, keeping ``compact_headroom`` × C free on each (``_Work.compact``)."""

    name = "mell"

    def __init__(
        self,
        batching: bool = True,
        max_moves_per_op: int = MAX_MOVES_PER_OP,
        replan_epochs: int = 3,
        fill_first: bool = False,
        compact: bool = False,
        compact_headroom: float = 0.05,
    ) -> None:
        if not 0 <= compact_headroom < 1:
            raise ValueError(f"compact_headroom must be in [0, 1), got {compact_headroom}")
        self.batching = batching
        self.fill_first = fill_first
        self.compact = compact
        self.compact_headroom = compact_headroom
        self.max_moves_per_op = max_moves_per_op
        self.replan_epochs = replan_epochs
        self._epoch = 0
        self._seq = 0
        self._cap = 0
        self._bundles = 0
        self._meta: dict[str, tuple[str, int]] = {}  # gpu -> (type, activation sequence number)
        self._items: dict[str, _Prev] = {}  # item id -> the item as last planned
        self._pending: dict[str, tuple[Migration, int]] = {}  # request -> (planned move, epoch first planned)
        self._op_moves: tuple[int, ...] = ()
        self._view = MellView(fill_first=fill_first)

    @property
    def last_op_moves(self) -> tuple[int, ...]:
        """Item moves made by each operation of the last epoch (before batching cancelled any)."""
        return self._op_moves

    def view(self) -> MellView:
        """The read-only view dispatch uses (:func:`allocate_target`), as of the last epoch."""
        return self._view

    def epoch(self, gpus: Sequence[GpuState], now: float) -> EpochPlan:
        del now
        self._epoch += 1
        self._cap = reference_capacity(g.capacity_bytes for g in gpus) or self._cap
        if self._cap <= 0:
            return EpochPlan(notes=("no GPU reports a KV capacity: nothing planned",))
        w = _Work(self._cap, gpus, self._meta, self._seq, self.max_moves_per_op)
        w.new_bundle = self._new_bundle
        w.fill_first = self.fill_first
        seen = self._observe(w, gpus)
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
    def _new_bundle(self) -> str:
        self._bundles += 1
        return f"bundle:{self._bundles}"

    @staticmethod
    def _observe(w: _Work, gpus: Sequence[GpuState]) -> dict[str, tuple[RequestState, str]]:
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
        self, w: _Work, seen: dict[str, tuple[RequestState, str]]
    ) -> dict[tuple[str, str, str], tuple[str, int]]:
        """Planned moves not done yet (deferred) are planned again, under their first id, for up to
        ``replan_epochs`` epochs while their destination still serves requests and has room. Returns
        reissued move -> (migration id, epoch first planned)."""
        used: dict[str, int] = defaultdict(int)
        for r, gid in seen.values():
            used[gid] += r.kv_bytes
        reissued: dict[tuple[str, str, str], tuple[str, int]] = {}
        for rid, (mig, first) in sorted(self._pending.items()):
            if rid not in seen or self._epoch - first > self.replan_epochs:
                continue
            r, at = seen[rid]
            dst = w.bins.get(mig.destination)
            if at != mig.source or dst is None or r.model not in dst.models or not used[dst.gpu_id]:
                continue
            if dst.capacity - used[dst.gpu_id] >= r.kv_bytes:
                used[at] -= r.kv_bytes
                used[dst.gpu_id] += r.kv_bytes
                seen[rid] = (r, dst.gpu_id)
                reissued[(rid, at, dst.gpu_id)] = (mig.migration_id, first)
                w.moves.append((rid, at, dst.gpu_id))
        return reissued

    def _build(self, w: _Work, seen: dict[str, tuple[RequestState, str]]) -> list[tuple]:
        """Place items (multi-items kept and normalised) and list the operations: Departs, Updates,
        Allocates (Algorithm 1's diff of this epoch against the last)."""
        cap = self._cap
        prev_of = {r.request_id: iid for iid, p in self._items.items() for r in p.reqs}
        ops: list[tuple] = []
        tiny: dict[tuple[str, str], tuple[dict[str | None, list], list]] = {}
        for rid, (r, gid) in seen.items():
            b, pid = w.bins[gid], prev_of.get(rid)
            if pid is not None and size_class(r.kv_bytes, cap) == TINY:
                groups, loose = tiny.setdefault((gid, r.model), ({}, []))
                prev = self._items[pid]
                (groups.setdefault(pid, []) if prev.bundle else loose).append((rid, r.kv_bytes))
                continue
            w.attach(Item(rid, r.model, {rid: r}, False, cap), b)
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
        w: _Work,
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
