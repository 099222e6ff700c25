"""llm-d's LoRA-affinity rule, as a baseline: a weighted sum of a LoRA-affinity score and a queue score,
the highest total wins.

llm-d's inference scheduler (the gateway API inference extension's ``lora-affinity-scorer``) scores
an engine 1.0 when the request's adapter is active there, 0.8 when the engine has room to load it,
0.6 when the adapter is waiting there (queued requests of it, not loaded yet) and 0 otherwise; its
``queue-scorer`` scores ``(max − q) / (max − min)`` over the engines' queue lengths ``q`` (1.0 when
all are equal). The total is ``lora_weight · lora + queue_weight · queue`` (both weights 1 by
default, llm-d's default profile); ties go to the smallest id. Our engines do not report waiting
adapters, so "waiting" is an adapter this policy sent to the engine within ``recent_s`` that its
report does not show yet (:class:`~llmfleet.policies.dispatch.lora_affinity.RecentAdapters`). There is
no load bound: a resident adapter's 1.0 against room's 0.8 is worth a fifth of the queue spread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from llmfleet.policies.dispatch.base import DispatchNeeds, DispatchRequest, EngineCandidate, eligible
from llmfleet.policies.dispatch.lora_affinity import RECENT_S, RecentAdapters

ACTIVE, ROOM, WAITING = 1.0, 0.8, 0.6


@dataclass(frozen=True)
class LlmdLoraOptions:
    """``lora_weight`` and ``queue_weight``: the scorers' weights; ``recent_s``: seconds a dispatch of
    an adapter counts as it waiting on that engine."""

    lora_weight: float = 1.0
    queue_weight: float = 1.0
    recent_s: float = RECENT_S

    def __post_init__(self) -> None:
        for name in ("lora_weight", "queue_weight", "recent_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
            object.__setattr__(self, name, float(v))


def lora_score(c: EngineCandidate, adapter: str, base: str, recent: RecentAdapters, now: float) -> float:
    """llm-d's LoRA-affinity score of ``c`` for a request of ``adapter`` (of ``base``)."""
    if c.holds_adapter(adapter):
        return ACTIVE
    pool = c.adapter_pool(base)
    if pool is not None and pool.free - recent.pending(c, now) > 0:
        return ROOM
    if recent.recent(c.engine_id, adapter, now):
        return WAITING
    return 0.0


class LlmdLoraAffinity:
    """Highest ``lora_weight · lora score + queue_weight · queue score``; ties by engine id."""

    name = "lora_llmd"
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(reads_queue=True)

    Options: ClassVar[type[LlmdLoraOptions]] = LlmdLoraOptions

    def __init__(self, options: LlmdLoraOptions | None = None) -> None:
        self.options = options if options is not None else LlmdLoraOptions()
        self.recent = RecentAdapters(self.options.recent_s)

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        pool = eligible(model, candidates, exclude)
        lo = min(c.queued for c in pool)
        hi = max(c.queued for c in pool)
        now = request.arrival_s if request is not None else 0.0
        base = request.base if request is not None else ""
        o = self.options

        def total(c: EngineCandidate) -> float:
            queue = 1.0 if hi == lo else (hi - c.queued) / (hi - lo)
            return o.lora_weight * lora_score(c, model, base, self.recent, now) + o.queue_weight * queue

        best = max(pool, key=total)  # max keeps the first (smallest id) of ties
        if request is not None and (base or any(c.adapter_pools for c in pool)):
            self.recent.sent(best.engine_id, model, now)
        return best.engine_id
