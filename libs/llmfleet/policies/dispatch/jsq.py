"""Join-the-shortest-queue dispatch: the engine with the fewest requests on it.

Queue length = ``running + waiting`` (:attr:`EngineCandidate.queued`), as last reported. Ties go to the
smallest engine id (the :func:`eligible` order). Stateless and deterministic; the request is ignored.
Classic JSQ (Winston 1977; Gupta et al., "Analysis of join-the-shortest-queue routing", 2007).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import ClassVar

from llmfleet.policies.dispatch.base import DispatchNeeds, DispatchRequest, EngineCandidate, eligible

_QUEUED = attrgetter("queued")


class JoinShortestQueue:
    """Fewest queued (running + waiting) requests; ties by engine id."""

    name = "jsq"
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(reads_queue=True, per_model=True)

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        del request
        pool = eligible(model, candidates, exclude)
        return min(pool, key=_QUEUED).engine_id  # min keeps the first (smallest id) of ties
