"""What a dispatch policy sees of the simulated instances: one
:class:`~llmfleet.policies.dispatch.EngineCandidate` per serving instance, listed per model and kept
current per instance (an instance whose state changed is refreshed before the next dispatch).

An instance with LoRA on serves the adapters of its bases too (as a live engine's node record
advertises them): its candidate lists them among its models, is listed under each, and carries its
adapter pools (resident adapters, slots); requests waiting for an adapter slot count as waiting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from llmfleet.policies.dispatch import (
    AdapterPoolView,
    DispatchNeeds,
    EngineCandidate,
    HostList,
    RequestProgress,
)
from llmfleet.sim.events import EventQueue
from llmfleet.sim.instance import SimInstance


class CandidateBook:
    """Per model, the candidates of the instances serving it (by id), and which instances changed."""

    def __init__(
        self,
        needs: DispatchNeeds,
        batch_cap: int,
        clock: EventQueue,
        adapters: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._adapters = dict(adapters or {})  # base model -> its adapters (served where LoRA is on)
        # a dispatcher reading per-request progress (Aladdin's constraint (d)) sees every busy instance
        # as of the dispatch time: tokens of the chunk in flight count up to ``now``
        self.reads_progress = needs.reads_progress
        self._batch_cap = batch_cap  # what runs at once
        self._clock = clock
        self.by_model: dict[str, HostList] = {}
        self._slot: dict[str, list[tuple[str, int]]] = {}  # instance -> [(model, index in by_model[model])]
        self._dirty: set[str] = set()

    def candidate(self, inst: SimInstance) -> EngineCandidate:
        """``inst`` as a dispatcher sees it now."""
        block = inst.layout.block_bytes
        models, pools = inst.serving, tuple[AdapterPoolView, ...]()
        if inst.adapter_slots:
            models = (*models, *(a for m in inst.serving for a in self._adapters.get(m, ())))
            pools = tuple(
                AdapterPoolView(m, slots.resident, slots.slots)
                for m, slots in inst.adapter_slots.items()
                if m in inst.serving
            )
        return EngineCandidate(
            inst.instance_id, models, len(inst.running), len(inst.waiting),
            inst.kv_used_bytes, inst.kv_capacity_bytes, inst.waiting.prompt_blocks * block,
            progress_of(inst, self._clock.now) if self.reads_progress else None,
            self._batch_cap,
            inst.alloc.cached_blocks * inst.layout.block_bytes if inst.core.prefix_caching else None,
            pools,
        )  # fmt: skip

    def touch(self, instance_id: str) -> None:
        """``instance_id``'s state changed: refresh its candidate before the next dispatch."""
        self._dirty.add(instance_id)

    def touch_busy(self, instances: Mapping[str, SimInstance]) -> None:
        """Progress moves with time on every busy instance: refresh them all."""
        self._dirty.update(i for i, inst in instances.items() if inst.work is not None)

    def refresh(self, instances: Mapping[str, SimInstance]) -> None:
        for iid in self._dirty:
            slots = self._slot.get(iid)
            if slots:
                c = self.candidate(instances[iid])
                for m, i in slots:
                    self.by_model[m][i] = c
        self._dirty.clear()

    def rebuild(self, instances: Mapping[str, SimInstance]) -> None:
        """Per model, the active instances serving it, by id."""
        self.by_model, self._slot = {}, {}
        for iid, inst in sorted(instances.items()):
            if not inst.serving or not inst.active:
                continue
            c = self.candidate(inst)
            for m in c.models:
                lst = self.by_model.setdefault(m, HostList(m))
                self._slot.setdefault(iid, []).append((m, len(lst)))
                lst.append(c)


def progress_of(inst: SimInstance, now: float) -> tuple[RequestProgress, ...]:
    """The requests that have produced their first token on ``inst``, with their tokens by ``now``
    (what a live engine would have streamed): those finished at the last step boundary plus, for
    members of a chunk in flight, its iterations that ended by ``now``."""
    w = inst.work
    done, members = 0, set[int]()
    if w is not None and not w.plan.static:
        k = w.plan.iterations
        if w.ends is not None:
            done = int(np.searchsorted(w.ends[:k], now, side="right"))
        elif w.end <= now:
            done = 1
        if done:
            members = {id(r) for r in w.plan.members}
    make = RequestProgress
    reqs = inst.core.requests.values()
    if not done:  # no chunk tokens to add: every request at its count of the last step boundary
        recs = [r.payload for r in reqs]
        return tuple(
            [
                make(c.request_id, c.model, c.produced, c.first_token_s)
                for c in recs
                if c.first_token_s is not None
            ]
        )
    out = []
    for r in reqs:
        rec = r.payload
        f = rec.first_token_s
        if f is None:
            continue  # no token yet: a pending prefill, not an ongoing request
        out.append(
            make(rec.request_id, rec.model, rec.produced + done if id(r) in members else rec.produced, f)
        )
    return tuple(out)
