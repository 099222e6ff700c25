"""Mell's hybrid migration: each migration moves as KV or as tokens, within per-epoch boundaries.

Mell §V "adaptive request migration" (papers/mell.txt): a migration is either a KV-cache transfer
(Llumnix-style, costs link bandwidth) or a token transfer re-prefilled at the destination
(ServerlessLLM-style, costs destination compute). Offline profiling gives every link a *communication
boundary* (bytes it moves within an epoch) and every instance a *computation boundary* (re-prefill
tokens it absorbs without slowing its batch). Dividing the migrations between the two is a two-bin
packing problem solved greedily (first fit or best fit) over the *global* list of migrations, so that
instances sharing a link or a destination stay within the boundaries ("global consensus"); what fits
neither bin waits for the next epoch.

Bins. A migration ``m`` has exactly two eligible bins: the link bin ``(m.source, m.destination)``
(mode ``"kv"``, consumes ``m.kv_bytes`` of ``budget.link(source, destination)``) and the compute bin
``m.destination`` (mode ``"tokens"``, consumes ``m.tokens`` of ``budget.prefill(destination)``). A
migration with ``tokens <= 0`` (context not reported) has no compute bin: re-prefilling nothing would
lose its state.

Order (deterministic, the "decreasing" of first-fit decreasing): descending ``kv_bytes``, then
descending ``tokens``, then ascending ``migration_id`` (:func:`transfer_order`); equal keys keep their
input order. ``scheduled`` and ``deferred`` come back in that order.

Fit. First fit: the first bin, in ``prefer`` order, with room. Best fit: of the bins with room, the
one left tightest, measured as the fraction of its epoch capacity that remains after the move (bytes
and tokens are not comparable otherwise); ties go to ``prefer``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from llmfleet.costmodel.iteration_costs import LinearCost
from llmfleet.policies.migration.base import Migration, TransferBudget, TransferMode

FitRule = Literal["first", "best"]

__all__ = [
    "FitRule",
    "HybridTransfer",
    "KvOnly",
    "TokensOnly",
    "communication_boundary",
    "computation_boundary",
    "reprefill_boundary",
    "transfer_order",
]


def transfer_order(migrations: Sequence[Migration]) -> list[Migration]:
    """The planners' processing order: descending ``kv_bytes``, descending ``tokens``, ascending
    ``migration_id`` (stable)."""
    return sorted(migrations, key=lambda m: (-m.kv_bytes, -m.tokens, m.migration_id))


def _pack(
    migrations: Sequence[Migration],
    budget: TransferBudget,
    modes: tuple[TransferMode, ...],
    fit: FitRule,
) -> tuple[tuple[Migration, ...], tuple[Migration, ...]]:
    """Greedy packing of ``migrations`` into the bins of ``modes`` (tried in that order)."""
    for m in migrations:
        if m.kv_bytes < 0 or m.tokens < 0:
            raise ValueError(f"migration {m.migration_id}: negative kv_bytes or tokens")
    left: dict[tuple[TransferMode, Hashable], float] = {}
    scheduled: list[Migration] = []
    deferred: list[Migration] = []
    for m in transfer_order(migrations):
        # (tightness after the move, preference rank, mode, bin key, room after the move)
        options: list[tuple[float, int, TransferMode, tuple[TransferMode, Hashable], float]] = []
        for rank, mode in enumerate(modes):
            if mode == "kv":
                key: tuple[TransferMode, Hashable] = ("kv", (m.source, m.destination))
                capacity = budget.link(m.source, m.destination)
                size = float(m.kv_bytes)
            else:
                if m.tokens <= 0:
                    continue
                key = ("tokens", m.destination)
                capacity = budget.prefill(m.destination)
                size = float(m.tokens)
            room = left.get(key, capacity)
            if size > room:
                continue
            if math.isinf(capacity):
                tightness = 1.0
            elif capacity <= 0:
                tightness = 0.0
            else:
                tightness = (room - size) / capacity
            options.append((tightness, rank, mode, key, room - size))
            if fit == "first":
                break
        if not options:
            deferred.append(m)
            continue
        _, _, mode, key, room_after = min(options, key=lambda o: (o[0], o[1]))
        left[key] = room_after
        scheduled.append(replace(m, mode=mode))
    return tuple(scheduled), tuple(deferred)


def _check_fit(fit: str) -> None:
    if fit not in ("first", "best"):
        raise ValueError(f"fit must be 'first' or 'best', not {fit!r}")


@dataclass(frozen=True)
class HybridTransfer:
    """Mell's hybrid migration (§V): two bins per migration (its link, its destination's re-prefill
    budget), ``fit`` = first or best fit over the global list in :func:`transfer_order`, ``prefer`` =
    the bin tried first (first fit) or winning ties (best fit). Implements ``TransferPlanner``."""

    fit: FitRule = "first"
    prefer: TransferMode = "kv"

    def __post_init__(self) -> None:
        _check_fit(self.fit)
        if self.prefer not in ("kv", "tokens"):
            raise ValueError(f"prefer must be 'kv' or 'tokens', not {self.prefer!r}")

    def assign(
        self, migrations: Sequence[Migration], budget: TransferBudget
    ) -> tuple[tuple[Migration, ...], tuple[Migration, ...]]:
        modes: tuple[TransferMode, ...] = ("kv", "tokens") if self.prefer == "kv" else ("tokens", "kv")
        return _pack(migrations, budget, modes, self.fit)


@dataclass(frozen=True)
class KvOnly:
    """Every migration as a KV transfer within its link's boundary (Llumnix's fixed strategy, the
    communication-intensive side of Mell's Finding 4); the rest is deferred."""

    def assign(
        self, migrations: Sequence[Migration], budget: TransferBudget
    ) -> tuple[tuple[Migration, ...], tuple[Migration, ...]]:
        return _pack(migrations, budget, ("kv",), "first")


@dataclass(frozen=True)
class TokensOnly:
    """Every migration as tokens re-prefilled within its destination's boundary (ServerlessLLM's fixed
    strategy, the compute-intensive side of Mell's Finding 4); the rest is deferred."""

    def assign(
        self, migrations: Sequence[Migration], budget: TransferBudget
    ) -> tuple[tuple[Migration, ...], tuple[Migration, ...]]:
        return _pack(migrations, budget, ("tokens",), "first")


def communication_boundary(bandwidth_bytes_per_s: float, epoch_s: float, share: float = 1.0) -> float:
    """A link's communication boundary (Mell §V, boundary profiling): the bytes it moves within one
    epoch, ``bandwidth × epoch × share`` — ``share`` the fraction of the link given to migration (so
    a transfer, whose source memory is held until it completes, finishes within the epoch)."""
    if bandwidth_bytes_per_s < 0 or epoch_s < 0:
        raise ValueError("bandwidth and epoch must be non-negative")
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must lie in [0, 1], not {share}")
    return bandwidth_bytes_per_s * epoch_s * share


def computation_boundary(
    prefill_time_s: Callable[[int], float],
    decode_step_s: float,
    epoch_s: float,
    slack: float,
    *,
    max_chunk_tokens: int = 1 << 20,
) -> float:
    """An instance's computation boundary at its batch size (Mell §V): re-prefill tokens per epoch
    that use only idle compute.

    Model (chunked prefill, Mell's ref. [28]): a short prefill fused into a decode step hides in the
    step's idle compute, a long one slows the batch. The instance runs ``n = floor(epoch_s /
    decode_step_s)`` decode steps per epoch (``decode_step_s`` at its batch size); each step absorbs a
    chunk of ``t*`` tokens, the most whose prefill time does not exceed ``slack × decode_step_s`` (so
    no step slows by more than ``slack``), found by bisection over the non-decreasing
    ``prefill_time_s`` (integer tokens, at most ``max_chunk_tokens``). Returns ``n × t*``.
    """
    if decode_step_s <= 0:
        raise ValueError("decode_step_s must be positive")
    if epoch_s < 0 or slack < 0:
        raise ValueError("epoch_s and slack must be non-negative")
    steps = math.floor(epoch_s / decode_step_s)
    allowed = slack * decode_step_s
    if steps == 0 or prefill_time_s(1) > allowed:
        return 0.0
    lo = 1  # prefill_time_s(lo) <= allowed
    hi = 2
    while hi <= max_chunk_tokens and prefill_time_s(hi) <= allowed:
        lo, hi = hi, hi * 2
    if hi > max_chunk_tokens:
        if prefill_time_s(max_chunk_tokens) <= allowed:
            return float(steps * max_chunk_tokens)
        hi = max_chunk_tokens  # prefill_time_s(hi) > allowed
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if prefill_time_s(mid) <= allowed:
            lo = mid
        else:
            hi = mid
    return float(steps * lo)


def reprefill_boundary(cost: LinearCost, batch: int, context_sum: int, epoch_s: float, slack: float) -> float:
    """Mell's computation boundary of an instance decoding ``batch`` requests (``context_sum`` tokens):
    the re-prefill tokens per epoch whose *marginal* cost, fused into one of its decode iterations,
    stays within ``slack`` of that iteration, times the iterations in the epoch."""
    batch = max(batch, 1)
    step = cost.iteration(0, 0, batch, context_sum)

    def marginal(t: int) -> float:
        return cost.iteration(t, t * t, batch, context_sum) - step

    return computation_boundary(marginal, step, epoch_s, slack)
