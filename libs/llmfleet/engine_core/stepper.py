"""The engine core's stepper interface: how one step is chosen and applied (continuous or static).

:class:`~llmfleet.engine_core.core.EngineCore` owns the request table, the queues, the KV pool view
and the step in flight; a stepper decides what the next step runs and what completing it does. A
stepper receives the core it works on with each call (its public state: queues, allocator, policy,
counters), so one is built before its core and chosen when the core is built
(:func:`~llmfleet.engine_core.core.stepper_for`: by the policy's type).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, cast, runtime_checkable

from llmfleet.engine_core.request import CoreRequest, StepEnd, StepPlan, StepResult
from llmfleet.engine_core.waiting import WaitingQueue
from llmfleet.kvblocks import BlockAllocator
from llmfleet.policies.batching.base import StaticBatch, StaticBatchPolicy
from llmfleet.policies.request.base import Batch, BatchLimits, PoolView, RequestPolicy, SchedRequest


@runtime_checkable
class ChunkablePolicy(Protocol):
    """A request policy that can promise its choice stays the same while only time passes (the
    simulator's exact fast-forward) and be charged a run of iterations at once."""

    def stable_until(
        self, batch: Batch, waiting: Sequence[SchedRequest], running: Sequence[SchedRequest], now: float
    ) -> float: ...


@runtime_checkable
class RunChargedPolicy(Protocol):
    def on_iterations(
        self, batch: Batch, durations_s: Sequence[float], now: float, requests: Sequence[SchedRequest]
    ) -> None: ...


@runtime_checkable
class PrefixAwarePolicy(Protocol):
    """A request policy that orders admissions by what the prefix cache holds: before each
    ``next_batch`` the core looks up, for up to ``prefix_lookahead`` of the waiting requests it shows
    (the first ones), how many prompt tokens each would take from the prefix cache now, and hands
    them over by request id; with ``prefix_refresh`` the blocks found become the most recently used
    in the pool's LRU, so that a waiting request's prefix outlives idle ones no request waits for."""

    prefix_lookahead: int
    prefix_refresh: bool

    def on_cached(self, cached: Mapping[str, int]) -> None: ...


class SteppedCore(Protocol):
    """What a stepper may use of the :class:`~llmfleet.engine_core.core.EngineCore` it steps: its
    request table and queues, the allocator, the policy, the counters and a few helpers."""

    alloc: BlockAllocator
    policy: RequestPolicy | StaticBatchPolicy
    batch_limits: BatchLimits
    requests: dict[str, CoreRequest]
    waiting: WaitingQueue
    running: dict[str, CoreRequest]
    preemptions: int
    requeues: int
    run_charged: bool
    prefix_aware: bool

    @property
    def paused_count(self) -> int: ...

    def pool_view(self) -> PoolView: ...

    def visible(self) -> tuple[list[CoreRequest], list[CoreRequest]]: ...

    def enqueue(self, r: CoreRequest, now: float) -> None: ...

    def fail_stuck(self, scheds_w: list[SchedRequest], pool: PoolView) -> None: ...
    def preemption_victims(self, now: float) -> list[CoreRequest]: ...

    def take_claimed_slot(self) -> None: ...

    def kv_bound(self, members: Sequence[CoreRequest], k_max: int) -> int: ...

    def cached_prefix(self, r: CoreRequest) -> list[int]: ...

    def cache_filled(self, members: Sequence[CoreRequest], produced: Sequence[int] | None) -> None: ...

    def cached_tokens(self, r: CoreRequest, refresh: bool = False) -> int: ...

    def note_prefix(self, prompt_tokens: int, cached: int) -> None: ...

    def take_adapter(self, r: CoreRequest) -> bool: ...

    def release_adapter(self, r: CoreRequest) -> None: ...


class Stepper(Protocol):
    """One iteration's choice and effects, for an engine core (:class:`SteppedCore`)."""

    static: bool  # plans are static-batch plans (padded rows)

    @property
    def batch(self) -> StaticBatch | None:
        """The static batch in progress (None between batches, and always for a continuous stepper)."""
        ...

    def schedule(self, core: SteppedCore, now: float) -> StepPlan | None:
        """The next step with its KV slots set up; None when nothing can run now."""
        ...

    def complete(self, core: SteppedCore, plan: StepPlan, end: StepEnd) -> StepResult:
        """Apply ``plan``, which ended as ``end`` says (see :meth:`~llmfleet.engine_core.core.EngineCore.complete`)."""
        ...

    def dropped(self, r: CoreRequest) -> None:
        """``r`` left the core for good (cancelled, failed, migrated away)."""
        ...


# The core pairs each policy with its stepper once (``stepper_for``, by the policy's type) and records
# what else the policy can do (``chunkable``, ``run_charged``, ``prefix_aware``). The helpers below give a stepper its
# core's policy as that type: casts, not checks, since they run every iteration.


def request_policy(core: SteppedCore) -> RequestPolicy:
    """``core``'s policy, for the continuous stepper (which ``stepper_for`` gives only request policies)."""
    return cast(RequestPolicy, core.policy)


def static_policy(core: SteppedCore) -> StaticBatchPolicy:
    """``core``'s policy, for the static stepper (which ``stepper_for`` gives only static batchers)."""
    return cast(StaticBatchPolicy, core.policy)


def run_charged_policy(core: SteppedCore) -> RunChargedPolicy:
    """``core``'s policy where ``core.run_charged`` says it is charged a run of iterations at once."""
    return cast(RunChargedPolicy, core.policy)


def prefix_aware_policy(core: SteppedCore) -> PrefixAwarePolicy:
    """``core``'s policy where ``core.prefix_aware`` says it orders admissions by cached prefixes."""
    return cast(PrefixAwarePolicy, core.policy)


def chunkable_policy(core: SteppedCore) -> ChunkablePolicy:
    """``core``'s policy where ``core.chunkable`` says it promises when its choice changes."""
    return cast(ChunkablePolicy, core.policy)
