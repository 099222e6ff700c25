"""Round-robin dispatch: cycle through the engines hosting the model, per model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from llmfleet.policies.dispatch.base import DispatchNeeds, DispatchRequest, EngineCandidate, eligible


@dataclass
class RoundRobin:
    """Each model keeps its own cursor; the engine set may change between calls."""

    name: str = "round_robin"
    _next: dict[str, int] = field(default_factory=dict)
    # never reads the candidates' load: callers may skip refreshing it, and the simulator may split a
    # run across processes (llmfleet.sim.partition) since routing does not depend on instance state
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(per_model=True)  # a cursor per model

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        del request
        pool = eligible(model, candidates, exclude)
        i = self._next.get(model, 0) % len(pool)
        self._next[model] = i + 1
        return pool[i].engine_id
