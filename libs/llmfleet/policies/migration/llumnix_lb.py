"""Llumnix-style load-balancing migration: Mell's "LB" baseline (Mell §VII; Llumnix, OSDI'24).

Llumnix migrates running requests from the most loaded instance to the least loaded one, by its
"freeness" (virtual usage), while their difference exceeds a threshold, preferring requests with
shorter sequences (less KV to copy). Mell describes it as "swapping with the lowest load and highest
load repeatedly" and uses it, with worst-fit dispatch, as the LB baseline.

Simplifications here: load = KV use fraction ``used_bytes / capacity_bytes`` of an active GPU
(Llumnix's virtual usage without its priority/headroom terms); only KV transfers (mode ``"kv"``).

Each epoch, repeatedly (at most ``max_migrations_per_epoch`` moves):

- sources in descending load (ties by ``gpu_id``); for the first source with a valid move, its
  requests shortest first (``tokens``, then ``kv_bytes``, then ``request_id``);
- a request's destination is the least loaded (ties by ``gpu_id``) other active GPU hosting its model
  such that the gap ``load(src) - load(dst)`` exceeds ``threshold``, the request fits in the
  destination's free bytes (never overfilled) and the move shrinks the gap's absolute value (no
  overshoot); loads are updated after each move.

Within an epoch a GPU is a source or a destination, not both, and a request moves at most once (no
chains or round trips). Inactive or zero-capacity GPUs take no part. The policy balances, it does not
pack: it never activates or deactivates GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from llmfleet.policies.migration.base import EpochPlan, GpuState, Migration, RequestState, migration_id

__all__ = ["LlumnixBalance", "LlumnixOptions"]


@dataclass(frozen=True)
class LlumnixOptions:
    """``threshold``: the KV-use gap between a source and a destination that a move needs;
    ``max_migrations_per_epoch``: the most moves one epoch plans."""

    threshold: float = 0.1
    max_migrations_per_epoch: int = 8

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise ValueError("threshold must be non-negative")
        if self.max_migrations_per_epoch < 0:
            raise ValueError("max_migrations_per_epoch must be non-negative")


class LlumnixBalance:
    """Mell's LB baseline: Llumnix's most-loaded → least-loaded migration by KV use fraction, with
    ``options``. Implements ``MigrationPolicy``; ``migration_id`` s carry an internal epoch counter (0,
    1, ...)."""

    Options: ClassVar[type[LlumnixOptions]] = LlumnixOptions

    def __init__(self, options: LlumnixOptions | None = None) -> None:
        o = options if options is not None else LlumnixOptions()
        self.threshold = o.threshold
        self.max_migrations_per_epoch = o.max_migrations_per_epoch
        self._epoch = 0

    def epoch(self, gpus: Sequence[GpuState], now: float) -> EpochPlan:
        epoch = self._epoch
        self._epoch += 1
        ids = [g.gpu_id for g in gpus]
        if len(set(ids)) != len(ids):
            raise ValueError("duplicate gpu_id in the cluster state")
        live = [g for g in gpus if g.active and g.capacity_bytes > 0]
        capacity = {g.gpu_id: g.capacity_bytes for g in live}
        used = {g.gpu_id: g.used_bytes for g in live}
        requests: dict[str, list[RequestState]] = {
            g.gpu_id: sorted(g.requests, key=lambda r: (r.tokens, r.kv_bytes, r.request_id)) for g in live
        }
        models = {g.gpu_id: set(g.models) for g in live}

        def load(gpu: str) -> float:
            return used[gpu] / capacity[gpu]

        sources: set[str] = set()
        destinations: set[str] = set()
        moved: set[tuple[str, str]] = set()  # (source, request_id) moved this epoch

        def destination(src: str, req: RequestState, ascending: list[str]) -> str | None:
            """The least loaded GPU that may take ``req`` from ``src``, if any."""
            for dst in ascending:
                gap = load(src) - load(dst)
                if gap <= self.threshold:
                    return None  # every later candidate is at least as loaded
                if dst == src or dst in sources or req.served_as not in models[dst]:
                    continue
                if req.kv_bytes > capacity[dst] - used[dst]:
                    continue  # never overfill a destination
                after = (used[src] - req.kv_bytes) / capacity[src] - (used[dst] + req.kv_bytes) / capacity[
                    dst
                ]
                if abs(after) < gap:
                    return dst
            return None

        def next_move() -> tuple[str, str, RequestState] | None:
            ascending = sorted(used, key=lambda gid: (load(gid), gid))
            for src in sorted(used, key=lambda gid: (-load(gid), gid)):
                if src in destinations:
                    continue
                for req in requests[src]:
                    if req.kv_bytes <= 0 or (src, req.request_id) in moved:
                        continue
                    dst = destination(src, req, ascending)
                    if dst is not None:
                        return src, dst, req
            return None

        migrations: list[Migration] = []
        while len(migrations) < self.max_migrations_per_epoch:
            move = next_move()
            if move is None:
                break
            src, dst, req = move
            used[src] -= req.kv_bytes
            used[dst] += req.kv_bytes
            sources.add(src)
            destinations.add(dst)
            moved.add((src, req.request_id))
            migrations.append(
                Migration(
                    migration_id=migration_id(req.request_id, src, dst, epoch),
                    request_id=req.request_id,
                    model=req.model,
                    source=src,
                    destination=dst,
                    kv_bytes=req.kv_bytes,
                    tokens=req.tokens,
                    mode="kv",
                )
            )
        return EpochPlan(migrations=tuple(migrations))
