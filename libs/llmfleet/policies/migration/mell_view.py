"""What Mell's dispatch reads of the packer: :class:`MellView` (GPU types, activation order, C) and
:func:`allocate_target`, Allocate's answer (Fig. 10) for where a new item goes. It runs the packer's own
rule (``mell_classes.choose``), so a request dispatched there is not moved again at the next epoch."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from llmfleet.policies.migration.base import GpuState
from llmfleet.policies.migration.mell_classes import RANK, Bin, Item, choose, item_class, reference_capacity


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
            b.add(Item(r.request_id, r.served_as, {r.request_id: r}, False, cap))
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
