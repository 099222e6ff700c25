"""Power-of-two-choices dispatch: sample two engines at random, send to the shorter queue.

Per request: draw two distinct engines uniformly from the eligible ones (sorted by id) with the
policy's own ``random.Random(seed)``, and pick the one with fewer queued requests (``running +
waiting``); a tie goes to the smaller engine id. With a single eligible engine it is returned and no
random number is drawn. The draw sequence depends only on ``seed`` and the number of eligible engines
per call, so a replay with the same seed and candidates is identical (simulator and service agree).
Mitzenmacher, "The power of two choices in randomized load balancing", IEEE TPDS 2001.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from llmfleet.policies.dispatch.base import DispatchNeeds, DispatchRequest, EngineCandidate, eligible


class PowerOfTwo:
    """Two seeded random samples, the shorter queue wins; ties by engine id."""

    name = "power_of_two"
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(reads_queue=True)

    def __init__(self, seed: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        self._rng = random.Random(seed)

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        del request
        pool = eligible(model, candidates, exclude)
        if len(pool) == 1:
            return pool[0].engine_id
        a, b = self._rng.sample(pool, 2)
        return min((a, b), key=lambda c: (c.queued, c.engine_id)).engine_id
