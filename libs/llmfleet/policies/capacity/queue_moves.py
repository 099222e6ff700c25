"""The alternative to late binding: bind early, then every epoch move requests that have
not started off engines whose queue is past their room, onto engines hosting the same model that have
room (Llumnix moves queued requests between instances; Aladdin's Algorithm 2 does it for its own
best fit). Works with any dispatch policy. A not-started request holds no KV: its prompt travels and
the destination prefills it.

Each source gives up its newest queued requests first (they would wait longest there), as many as
it is past its room; each goes to the candidate with the most room left, which is charged for it.
Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmfleet.policies.capacity.saturation import Saturation
from llmfleet.policies.dispatch.base import EngineCandidate


def room(c: EngineCandidate, saturation: Saturation, occupancy: int | None = None) -> int:
    """Requests ``c`` can take before it has no room (negative: how far past it is); ``occupancy``:
    its requests (default ``c.queued``)."""
    return saturation.limit(c) - (c.queued if occupancy is None else occupancy)


def plan_queue_moves(
    candidates: Sequence[EngineCandidate],
    queued: Mapping[str, Sequence[tuple[str, str]]],
    saturation: Saturation,
    max_moves: int = 1_000,
    occupancy: Mapping[str, int] | None = None,
) -> list[tuple[str, str, str]]:
    """Moves ``(request_id, from_engine, to_engine)``. ``queued``: per engine, its not-started requests
    ``(request_id, model)`` in arrival order; ``occupancy``: per engine, its requests (default the
    candidates' ``queued``)."""
    occ = occupancy or {}
    left = {c.engine_id: room(c, saturation, occ.get(c.engine_id)) for c in candidates}
    hosts = {c.engine_id: set(c.models) for c in candidates}
    moves: list[tuple[str, str, str]] = []
    for src in sorted(left, key=lambda e: (left[e], e)):  # the most overloaded first
        excess = -left[src]
        waiting = list(queued.get(src, ()))
        while excess > 0 and waiting and len(moves) < max_moves:
            rid, model = waiting.pop()  # the newest first
            dsts = [e for e in left if e != src and model in hosts[e] and left[e] > 0]
            if not dsts:
                continue
            dst = max(dsts, key=lambda e: (left[e], e))
            moves.append((rid, src, dst))
            left[dst] -= 1
            left[src] += 1
            excess -= 1
    return moves
