"""Late binding: whether an engine has room for one more request (llm-d's flow control, KServe's
activator). An engine whose batch is full and whose own queue is past a small slack, or whose KV pool
is nearly taken, has no room: a scheduler that binds late keeps the request in its own queue until one
has, so capacity that scaling adds serves the queue at once instead of the queue staying where it
landed.

The batch size is the engine's own report (``EngineCandidate.max_running``: the most requests it
admits at once, vLLM's ``max_num_seqs``); without one, only the engine's waiting queue counts. Pure.

The default slack is 0 (``spec/defaults.py``; docs/benchmarks/burst.md): an engine takes what it
runs at once and no more while the scheduler holds the rest. On the emulated L4 burst of ``make
bench-burst`` (1,000 identical 48-token requests) it served 1.66-1.72x early binding's throughput live
against 1.57-1.62x with slack 4, since requests queued past an engine's batch are bound early and
become a cohort of their own; on bursts of mixed lengths (``--hetero``) 0 and 4 finished within 2% of
each other, live and simulated, on L4 and A100; on the CPU engines' and emulated A100s' uniform bursts
the medians were the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmfleet.policies.dispatch.base import EngineCandidate
from llmfleet.spec.defaults import KV_ROOM_FRACTION, QUEUE_SLACK


@dataclass(frozen=True)
class Saturation:
    """``queue_slack``: requests an engine may hold waiting beyond its batch; ``kv_fraction``: the
    share of its KV pool (used plus what its queued prompts will take) past which it has no room."""

    queue_slack: int = QUEUE_SLACK
    kv_fraction: float = KV_ROOM_FRACTION

    def __post_init__(self) -> None:
        if self.queue_slack < 0:
            raise ValueError(f"queue_slack must be >= 0, got {self.queue_slack}")
        if not 0.0 < self.kv_fraction <= 1.0:
            raise ValueError(f"kv_fraction must be in (0, 1], got {self.kv_fraction}")

    def limit(self, c: EngineCandidate) -> int:
        """Requests ``c`` may hold (running + queued) while it has room; without a batch size, the
        requests it may hold waiting (at least one)."""
        return c.max_running + self.queue_slack if c.max_running > 0 else max(1, self.queue_slack)

    def has_room(self, c: EngineCandidate, occupancy: int | None = None) -> bool:
        """Room for one more request: its requests (``occupancy``, default ``c.queued``) below (batch +
        slack), or, when the engine reports no batch size, its waiting requests below max(1, slack); and
        KV (used + queued prompts) below ``kv_fraction`` of the pool."""
        if c.max_running > 0:
            if (c.queued if occupancy is None else occupancy) >= self.limit(c):
                return False
        elif c.waiting >= self.limit(c):
            return False
        if c.kv_capacity_bytes > 0:
            return c.kv_used_bytes + c.kv_waiting_bytes < self.kv_fraction * c.kv_capacity_bytes
        return True

    def with_room(self, candidates: Iterable[EngineCandidate]) -> list[EngineCandidate]:
        return [c for c in candidates if self.has_room(c)]
