"""LoRA-affinity dispatch: send a request of a LoRA adapter where the adapter is loaded, else where it
has room to load, within a load bound, so that a hot adapter spreads over engines once its engine is
loaded.

**What an engine holds.** Each candidate carries its adapter pools (:class:`AdapterPoolView`, one per
base model with LoRA on: the resident adapters and the slots, ``max_loras``), from the engine's load
report (``ModelLoad.adapters``, ``adapter_slots``) or from the simulated instance. A report lags the
dispatches made since, so the policy also remembers where it sent each adapter in the last
``recent_s`` seconds (the request's ``arrival_s``: the policy reads no clock): the engine is loading
it, or has it already, and a burst of a cold adapter does not load it on every engine before the next
report says where it went. Such an adapter counts as resident, and takes one of the pool's free slots.

**Tiers.** Per eligible engine (one that serves the adapter: its base is loaded there):

* 2 — the adapter is resident (or was sent there within ``recent_s``);
* 1 — the base's pool has a free slot (loading costs a copy and evicts nothing);
* 0 — it must evict the least recently used adapter no request holds (or the pool is unknown).

The room tier needs the request's base (``DispatchRequest.base``, which the scheduler reads from the
model catalog and the simulator from the service); without one, the only pool of a candidate is taken
as the base's. A request of a plain model ranks every engine at tier 0: join-the-shortest-queue.

**Choice.** As :mod:`~llmfleet.policies.dispatch.prefix_affinity` bounds cache affinity: the engines
whose load (``queued``, which the live load book raises by each request sent since the last report)
is within ``max(least + max_load_excess, least · max_load_ratio)`` of the least loaded are allowed;
among them the highest tier wins, then the least loaded, then the smallest id. A hot adapter stays on
the engines holding it until they are past the bound; the next request goes to the least loaded
allowed engine with room (else the least loaded allowed one), which loads it, and from then on the
adapter's traffic joins the shortest queue among its holders.

Baseline: llm-d's LoRA-affinity scorer (:mod:`~llmfleet.policies.dispatch.lora_llmd`) scores
resident 1.0, room 0.8, waiting 0.6 and adds a queue score; it has no bound, so its preference for a
resident adapter trades against load at a fixed exchange rate rather than up to a load bound.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from llmfleet.policies.dispatch.base import (
    DispatchNeeds,
    DispatchRequest,
    EngineCandidate,
    eligible,
    load_bounded,
)

RESIDENT, ROOM, EVICT = 2, 1, 0
RECENT_S = 2.0  # seconds a dispatch counts as the adapter loading there (about two report intervals)


class RecentAdapters:
    """Where each adapter was sent lately: (engine, adapter) -> last dispatch time, kept ``recent_s``."""

    def __init__(self, recent_s: float) -> None:
        self.recent_s = recent_s
        self._sent: OrderedDict[tuple[str, str], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sent)

    def sent(self, engine_id: str, adapter: str, now: float) -> None:
        key = (engine_id, adapter)
        self._sent[key] = now
        self._sent.move_to_end(key)
        horizon = now - self.recent_s
        while self._sent:
            key, seen = next(iter(self._sent.items()))
            if seen >= horizon:
                break
            del self._sent[key]

    def recent(self, engine_id: str, adapter: str, now: float) -> bool:
        seen = self._sent.get((engine_id, adapter))
        return seen is not None and seen >= now - self.recent_s

    def pending(self, c: EngineCandidate, now: float) -> int:
        """Adapters sent to ``c`` lately that its report does not show resident (each takes a slot)."""
        horizon = now - self.recent_s
        return sum(
            1
            for (e, a), t in self._sent.items()
            if e == c.engine_id and t >= horizon and not c.holds_adapter(a)
        )


def adapter_tier(
    c: EngineCandidate, adapter: str, base: str, recent: RecentAdapters | None = None, now: float = 0.0
) -> int:
    """:data:`RESIDENT`, :data:`ROOM` or :data:`EVICT` for a request of ``adapter`` (of ``base``) on ``c``."""
    if c.holds_adapter(adapter) or (recent is not None and recent.recent(c.engine_id, adapter, now)):
        return RESIDENT
    pool = c.adapter_pool(base)
    if pool is None or (not base and len(c.adapter_pools) != 1):
        return EVICT
    taken = recent.pending(c, now) if recent is not None and len(recent) else 0
    return ROOM if pool.free - taken > 0 else EVICT


@dataclass
class LoraStats:
    """Choices made for adapter requests by the chosen engine's tier, and those where an engine of a
    higher tier was over the load bound."""

    resident: int = 0
    room: int = 0
    evict: int = 0
    over_bound: int = 0


@dataclass(frozen=True)
class LoraAffinityOptions:
    """``max_load_excess`` and ``max_load_ratio``: the load bound (as prefix_affinity's);
    ``recent_s``: seconds a dispatch of an adapter to an engine counts as it being loaded there."""

    max_load_excess: int = 4
    max_load_ratio: float = 1.5
    recent_s: float = RECENT_S

    def __post_init__(self) -> None:
        excess = self.max_load_excess
        if isinstance(excess, bool) or not isinstance(excess, int) or excess < 0:
            raise ValueError(f"max_load_excess must be an int >= 0, got {excess!r}")
        for name in ("max_load_ratio", "recent_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.max_load_ratio < 1:
            raise ValueError(f"max_load_ratio must be >= 1, got {self.max_load_ratio!r}")
        if self.recent_s < 0:
            raise ValueError(f"recent_s must be >= 0, got {self.recent_s!r}")


class LoraAffinity:
    """The engine of the highest tier (adapter resident, room to load it, must evict) among those within
    the load bound; then the least loaded; then the smallest id (see the module docstring)."""

    name = "lora_affinity"
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(reads_queue=True)

    Options: ClassVar[type[LoraAffinityOptions]] = LoraAffinityOptions

    def __init__(self, options: LoraAffinityOptions | None = None) -> None:
        self.options = options if options is not None else LoraAffinityOptions()
        self.recent = RecentAdapters(self.options.recent_s)
        self.stats = LoraStats()

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        pool = eligible(model, candidates, exclude)
        if request is None:
            return min(pool, key=lambda c: c.queued).engine_id  # ties: the smallest id
        allowed, bound = load_bounded(pool, self.options.max_load_excess, self.options.max_load_ratio)
        now, base = request.arrival_s, request.base
        tier = {c.engine_id: adapter_tier(c, model, base, self.recent, now) for c in pool}
        best = min(allowed, key=lambda c: (-tier[c.engine_id], c.queued))  # ties: smallest id
        got = tier[best.engine_id]
        if base or any(c.adapter_pools for c in pool):
            stats = self.stats
            stats.resident += got == RESIDENT
            stats.room += got == ROOM
            stats.evict += got == EVICT
            stats.over_bound += any(tier[c.engine_id] > got for c in pool if c.queued > bound)
            self.recent.sent(best.engine_id, model, now)
        return best.engine_id
