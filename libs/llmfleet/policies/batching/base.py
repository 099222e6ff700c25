"""Static batching: the interface for batchers that run a fixed group of requests to completion.

In static batching (HF ``generate``-style, the setting of SCLS and UELLM) a batch is formed once: every
prompt is padded to the batch's longest prompt, and the batch decodes until its longest output finishes
or ``max_iterations`` runs out (SCLS slices). Requests that finished early hold their padded slot until
the batch ends. Unfinished requests at a slice end go back to ``waiting`` (their generated tokens folded
into ``prompt_tokens``, as after a preemption) for the policy to re-batch.

Calling contract (engine and simulator alike): ``on_arrival`` once per request; whenever the engine is
idle, ``form_batch(waiting, pool, limits, now)`` → a :class:`StaticBatch` or ``None`` (nothing to run);
after the batch, ``on_batch_done(batch, duration_s, now, requests)``. KV of a static batch is the padded
size n·(longest prompt + iterations run); if the pool cannot grow, the batch ends early (an OOM slice end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from llmfleet.policies.request.base import BatchLimits, PoolView, SchedRequest, check_duration, mark_ran


@dataclass(frozen=True)
class StaticBatch:
    """One static batch of ONE model; ``max_iterations`` None = run to the longest output."""

    model: str
    request_ids: tuple[str, ...]
    max_iterations: int | None = None

    def __post_init__(self) -> None:
        if not self.request_ids:
            raise ValueError("a static batch holds at least one request")
        if self.max_iterations is not None and self.max_iterations < 1:
            raise ValueError(f"max_iterations must be >= 1 or None, got {self.max_iterations}")


@runtime_checkable
class StaticBatchPolicy(Protocol):
    name: str

    def on_arrival(self, req: SchedRequest, now: float) -> None: ...

    def form_batch(
        self, waiting: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits, now: float
    ) -> StaticBatch | None:
        """The next static batch from ``waiting``, or None. Its padded admission
        ``padded_blocks(pool, members, 1)`` must fit ``pool.available_blocks``."""
        ...

    def on_batch_done(
        self, batch: StaticBatch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None: ...


def padded_tokens(requests: Sequence[SchedRequest], new_tokens: int) -> int:
    """KV tokens of a static batch: n · (longest prompt + new_tokens) (every row padded)."""
    if not requests:
        return 0
    return len(requests) * (max(r.prompt_tokens for r in requests) + new_tokens)


def padded_blocks(pool: PoolView, requests: Sequence[SchedRequest], new_tokens: int) -> int:
    """Blocks of a padded static batch: n rows of ceil((longest prompt + new_tokens) / T_m) blocks."""
    if not requests:
        return 0
    longest = max(r.prompt_tokens for r in requests)
    return len(requests) * pool.blocks_for(requests[0].model, longest + new_tokens)


def first_fitting(waits: Sequence[SchedRequest], pool: PoolView) -> int | None:
    """Index of the first request in ``waits`` whose padded admission (prompt + 1) fits the blocks
    above the watermark, or None."""
    avail = pool.available_blocks
    return next((i for i, r in enumerate(waits) if padded_blocks(pool, [r], 1) <= avail), None)


def padding_tokens(requests: Sequence[SchedRequest], output_tokens: Sequence[int]) -> int:
    """Wasted token slots of a static batch run to its longest output: Σ (max_in − in_i) + Σ (max_out − out_i)
    (UELLM Figure 3's padding count)."""
    if not requests:
        return 0
    max_in = max(r.prompt_tokens for r in requests)
    max_out = max(output_tokens)
    return sum(max_in - r.prompt_tokens for r in requests) + sum(max_out - o for o in output_tokens)


def mark_batch_ran(
    batch: StaticBatch, duration_s: float, now: float, requests: Sequence[SchedRequest]
) -> None:
    """The members of ``batch`` among ``requests`` ran an iteration of ``duration_s`` ending at ``now``
    (every static batcher's ``on_batch_done``)."""
    check_duration(duration_s)
    ids = set(batch.request_ids)
    for r in requests:
        if r.request_id in ids:
            mark_ran(r, duration_s, now)
