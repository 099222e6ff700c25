"""The engine core's stepper interface: how one step is chosen and applied (continuous or static).

:class:`~llmfleet.engine_core.core.EngineCore` owns the request table, the queues, the KV pool view
and the step in flight; a stepper decides what the next step runs and what completing it does. A
stepper receives the core it works on with each call (its public state: queues, allocator, policy,
counters), so one is built before its core and chosen when the core is built
(:func:`~llmfleet.engine_core.core.stepper_for`: by the policy's type).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from llmfleet.engine_core.request import CoreRequest, StepEnd, StepPlan, StepResult
from llmfleet.policies.batching.base import StaticBatch

if TYPE_CHECKING:
    from llmfleet.engine_core.core import EngineCore


class Stepper(Protocol):
    """One iteration's choice and effects, for an :class:`EngineCore`."""

    static: bool  # plans are static-batch plans (padded rows)

    @property
    def batch(self) -> StaticBatch | None:
        """The static batch in progress (None between batches, and always for a continuous stepper)."""
        ...

    def schedule(self, core: EngineCore, now: float) -> StepPlan | None:
        """The next step with its KV slots set up; None when nothing can run now."""
        ...

    def complete(self, core: EngineCore, plan: StepPlan, end: StepEnd) -> StepResult:
        """Apply ``plan``, which ended as ``end`` says (see :meth:`EngineCore.complete`)."""
        ...

    def dropped(self, r: CoreRequest) -> None:
        """``r`` left the core for good (cancelled, failed, migrated away)."""
        ...
