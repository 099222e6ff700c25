"""One epoch of Mell's packer: the bins, where each item is, the buffered moves and the operations of
Fig. 10 (Allocate, Depart, Update, the overload repair and our compaction) as :class:`EpochWork`'s
methods. Every move is fit-checked and counted against the per-operation cap (Theorem 3); a refused move
leaves the item where it was. :class:`~llmfleet.policies.migration.mell.MellPacker` builds one per epoch."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llmfleet.policies.migration.base import GpuState
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
    most_recent,
    size_class,
)


@dataclass
class _Op:
    """One operation in progress: its moves so far, and each touched GPU's type and place before it."""

    name: str
    moves: int = 0
    start: dict[str, tuple[str | None, int]] = field(default_factory=dict)


class EpochWork:
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
        # GPUs empty at the epoch's start that a move fills: the operation of the first move into each,
        # and those whose first incoming item fitted on another active GPU of its model then
        self.filled_by: dict[str, str] = {}
        self.room_elsewhere: set[str] = set()
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
        if not dst.was_active and dst.gpu_id not in self.filled_by:
            self.filled_by[dst.gpu_id] = op.name
            if any(b.n and b.free >= it.size for b in self.hosts[it.model] if b is not dst and b is not src):
                self.room_elsewhere.add(dst.gpu_id)
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
        """``it`` (tiny, on ``b``) joins the largest multi-item of its model there that stays within
        its class, else becomes one. Never a finished multi-item: its Depart takes all its requests."""
        self.detach(it)
        room = [
            x
            for x in b.items.values()
            if x.bundle and x.model == it.model and fits_bundle(x.size + it.size, self.cap)
            and self.ghosts.isdisjoint(x.reqs)
        ]  # fmt: skip
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
        """Beyond the paper (``MellOptions(compact=True)``): close one GPU per epoch when it can be
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
