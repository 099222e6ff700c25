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
from dataclasses import dataclass
from typing import ClassVar

from llmfleet.policies.dispatch.base import DispatchNeeds, DispatchRequest, EngineCandidate, eligible


@dataclass(frozen=True)
class PowerOfTwoOptions:
    """``seed``: the seed of the policy's random draws (the same seed, the same choices)."""

    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")


class PowerOfTwo:
    """Two seeded random samples, the shorter queue wins; ties by engine id."""

    name = "power_of_two"
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(reads_queue=True)

    Options: ClassVar[type[PowerOfTwoOptions]] = PowerOfTwoOptions

    def __init__(self, options: PowerOfTwoOptions | None = None, *, rng: random.Random | None = None) -> None:
        """``rng``: the source of the two samples; ``random.Random(seed)`` when None."""
        self.seed = (options if options is not None else PowerOfTwoOptions()).seed
        self._rng = rng if rng is not None else random.Random(self.seed)

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
