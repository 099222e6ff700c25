"""Mell's size classes, multi-items, GPUs as bins and the Allocate rule (Mell §VI-C, Fig. 10).

A request's class comes from its KV size *now* relative to a GPU's KV capacity C: L (C/2, C],
M (C/3, C/2], S (C/4, C/3], T (C/8, C/4]. A request of at most C/8 is *tiny*: tiny requests travel in
multi-items (bundles of tiny requests of one model on one GPU, total in (C/8, C/4]) placed as T items.
A GPU's type is the class of its largest item. Pure functions only; integer arithmetic (no rounding).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from llmfleet.policies.migration.base import GpuState, RequestState

L, M, S, T, TINY = "L", "M", "S", "T", "t"
RANK = {T: 1, S: 2, M: 3, L: 4}
"""Order of item classes and GPU types (a GPU's type is its largest item's class)."""

Member = tuple[str, int]
"""A tiny request in a multi-item: (request id, KV bytes)."""


def size_class(size: int, capacity: int) -> str:
    """L, M, S, T, or TINY (≤ C/8) for ``size`` bytes against capacity C (sizes above C count as L)."""
    if 2 * size > capacity:
        return L
    if 3 * size > capacity:
        return M
    if 4 * size > capacity:
        return S
    if 8 * size > capacity:
        return T
    return TINY


def item_class(size: int, capacity: int) -> str:
    """The class an item of ``size`` is placed as: tiny requests go in multi-items, which count as T."""
    cls = size_class(size, capacity)
    return T if cls == TINY else cls


def gpu_type(gpu: GpuState) -> str:
    """A GPU's type as its requests stand: the class of its largest request ("" when empty). Status
    shows it; the packer's own view (its multi-items) may differ for GPUs of tiny requests only."""
    if not gpu.requests or gpu.capacity_bytes <= 0:
        return ""
    return item_class(max(r.kv_bytes for r in gpu.requests), gpu.capacity_bytes)


def fits_bundle(size: int, capacity: int) -> bool:
    """Whether a multi-item of ``size`` bytes is still within its class bound (≤ C/4)."""
    return 4 * size <= capacity


def reference_capacity(capacities: Iterable[int]) -> int:
    """The C that classes are measured against: the most common positive capacity (the paper assumes
    homogeneous GPUs), the smaller one on ties; 0 when none is known. Fits always use each GPU's own."""
    counts = Counter(c for c in capacities if c > 0)
    if not counts:
        return 0
    return min(counts, key=lambda c: (-counts[c], c))


def pack_bundles(
    groups: Sequence[tuple[str | None, Sequence[Member]]], loose: Sequence[Member], capacity: int
) -> list[tuple[str | None, list[Member]]]:
    """Normalise the multi-items of one model on one GPU without moving any request.

    ``groups``: the existing multi-items (id, members) on that GPU; ``loose``: tiny requests in none.
    A multi-item grown past C/4 sheds its smallest members; incomplete ones (≤ C/8) are merged in pairs
    that stay within C/4; shed and loose requests join the fullest multi-item with room, else start one
    (id None: the caller names it). Deterministic: members sorted by (size desc, id)."""
    out: list[tuple[str | None, list[Member]]] = []
    spill = list(loose)
    for bid, members in groups:
        keep: list[Member] = []
        total = 0
        for m in sorted(members, key=lambda m: (-m[1], m[0])):
            if fits_bundle(total + m[1], capacity):
                keep.append(m)
                total += m[1]
            else:
                spill.append(m)
        if keep:
            out.append((bid, keep))
    merged: list[tuple[str | None, list[Member]]] = []
    for bid, members in out:
        size = _total(members)
        home = next(
            (
                g
                for g in merged
                if 8 * size <= capacity
                and 8 * _total(g[1]) <= capacity
                and fits_bundle(size + _total(g[1]), capacity)
            ),
            None,
        )
        if home is None:
            merged.append((bid, list(members)))
        else:
            home[1].extend(members)
    for m in sorted(spill, key=lambda m: (-m[1], m[0])):
        room = [g for g in merged if fits_bundle(_total(g[1]) + m[1], capacity)]
        if room:
            max(room, key=lambda g: _total(g[1]))[1].append(m)
        else:
            merged.append((None, [m]))
    return merged


def _total(members: Sequence[Member]) -> int:
    return sum(size for _, size in members)


class Item:
    """A request, or a multi-item of tiny requests (a bundle, placed as one T item)."""

    __slots__ = ("bundle", "cls", "item_id", "model", "reqs", "size")

    def __init__(
        self, item_id: str, model: str, reqs: dict[str, RequestState], bundle: bool, cap: int
    ) -> None:
        self.item_id, self.model, self.reqs, self.bundle = item_id, model, reqs, bundle
        self.size = sum([r.kv_bytes for r in reqs.values()]) if bundle else next(iter(reqs.values())).kv_bytes
        self.cls = T if bundle else item_class(self.size, cap)


class Bin:
    """A GPU as a bin, with the aggregates Allocate reads, kept current on add/remove: ``largest`` (its
    largest item, which gives its type), and besides that item ``t_bytes`` (T items' bytes) and ``mid``
    (how many S/M items)."""

    __slots__ = (
        "capacity", "counts", "gpu_id", "items", "kind", "largest", "machine", "mid", "models", "n", "seq",
        "t_bytes", "top", "used", "was_active",
    )  # fmt: skip

    def __init__(self, g: GpuState) -> None:
        self.gpu_id, self.models, self.capacity = g.gpu_id, frozenset(g.models), g.capacity_bytes
        self.machine, self.was_active = g.machine, g.active
        self.items: dict[str, Item] = {}
        self.counts = dict.fromkeys(RANK, 0)  # items per class
        self.used = self.n = self.largest = self.t_bytes = self.mid = 0
        self.top: Item | None = None
        self.kind: str | None = None  # its type as the packer keeps it (see content_kind)
        self.seq = -1  # activation sequence number

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def content_kind(self) -> str | None:
        """The class of its largest item (None when empty)."""
        return next((c for c in (L, M, S, T) if self.counts[c]), None)

    def add(self, it: Item) -> None:
        self.items[it.item_id] = it
        self.used += it.size
        self.n += len(it.reqs)
        self.counts[it.cls] += 1
        if self.top is None or (it.size, it.item_id) > (self.top.size, self.top.item_id):
            if self.top is not None:
                self._aside(self.top, 1)
            self.top, self.largest = it, it.size
        else:
            self._aside(it, 1)

    def remove(self, it: Item) -> None:
        del self.items[it.item_id]
        self.used -= it.size
        self.n -= len(it.reqs)
        self.counts[it.cls] -= 1
        if it is not self.top:
            self._aside(it, -1)
            return
        self.top = max(self.items.values(), key=lambda x: (x.size, x.item_id), default=None)
        self.largest = self.top.size if self.top else 0
        if self.top is not None:
            self._aside(self.top, -1)

    def _aside(self, x: Item, sign: int) -> None:
        if x.cls == T:
            self.t_bytes += sign * x.size
        elif x.cls in (S, M):
            self.mid += sign


def most_recent(bins: Iterable[Bin], kind: str) -> Bin | None:
    return max((b for b in bins if b.n and b.kind == kind), key=lambda b: b.seq, default=None)


def choose(
    cls: str, size: int, hosts: Sequence[Bin], source: Bin | None = None, *, fill_first: bool = False
) -> tuple[Bin | None, bool]:
    """Allocate(i)'s target (Fig. 10) among ``hosts``: (bin, opened). T: the highest-priority L-GPU with
    room, else the most recent T-GPU; S/M: an L-GPU j with S_L + S_i < C and no S/M yet (its T items
    make way), else the most recent GPU of i's class; L, or those full: open an empty GPU (the source
    itself first: no move), else best fit, else None. Priority: fewer requests, more idle memory, same
    machine as the source, GPU id.

    ``fill_first`` (beyond the paper; off by default): before opening a GPU, put the item on an active
    GPU with room whatever its type — the source when it has room (no move), else best fit (least free
    memory left). Types then mix (a T item on an S-GPU, an S item on a T-GPU, which becomes an S-GPU),
    so Theorem 1's properties no longer hold as stated; the aim is fewer GPUs opened at peaks."""
    machine = source.machine if source is not None else None

    def prio(b: Bin) -> tuple[int, int, bool, str]:
        return (b.n, -b.free, machine is not None and b.machine != machine, b.gpu_id)

    live = [b for b in hosts if b.n]
    if cls == T:
        on_l = [b for b in live if b.kind == L and b.free >= size]
        recent = most_recent((b for b in live if b.free >= size), T)
    elif cls in (S, M):
        on_l = [
            b
            for b in live
            if b.kind == L and not b.mid and b.largest + size < b.capacity and b.free + b.t_bytes >= size
        ]
        recent = most_recent((b for b in live if b.free >= size), cls)
    else:
        on_l, recent = [], None
    if on_l:
        return min(on_l, key=prio), False
    if recent is not None:
        return recent, False
    if fill_first:
        fits = [b for b in live if b.free >= size]
        if source is not None and source in fits:
            return source, False
        if fits:
            return min(fits, key=lambda b: (b.free - size, b.gpu_id)), False
    empty = [b for b in hosts if not b.n and b.capacity >= size]
    if empty:
        key = lambda b: (b is not source, machine is not None and b.machine != machine, -b.capacity, b.gpu_id)  # noqa: E731
        return min(empty, key=key), True
    fits = [b for b in live if b.free >= size]
    return (min(fits, key=lambda b: (b.free - size, b.gpu_id)), False) if fits else (None, False)
