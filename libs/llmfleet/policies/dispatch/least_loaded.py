"""Least-loaded dispatch: the engine with the lowest KV-cache utilization ``kv_used / kv_capacity``.

Utilization is compared exactly (as fractions). Ties go to fewer queued requests (``running +
waiting``), then the smaller engine id. When any eligible engine has an unknown KV capacity (reported as
0), utilizations are not comparable across the set, so the load of every candidate is its queue length
instead (the policy then behaves as join-the-shortest-queue, ties by id). Stateless; the request is
ignored. The usual memory-load baseline (cf. Llumnix, OSDI 2024, which dispatches new requests by
KV-memory load).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import ClassVar

from llmfleet.policies.dispatch.base import DispatchNeeds, DispatchRequest, EngineCandidate, eligible


class LeastLoaded:
    """Lowest KV utilization (queue length when a capacity is unknown); ties by queued, then id."""

    name = "least_loaded"
    # KV utilization, then queue length; reading kv_used_bytes, the simulator keeps it exact (no fast-forward)
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(reads_queue=True, reads_kv=True)

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        del request
        pool = eligible(model, candidates, exclude)
        if all(c.kv_capacity_bytes > 0 for c in pool):
            best = min(pool, key=lambda c: (Fraction(c.kv_used_bytes, c.kv_capacity_bytes), c.queued))
        else:
            best = min(pool, key=lambda c: c.queued)
        return best.engine_id  # min keeps the first (smallest id) of ties
