"""The narrow interface through which the live placement leader gets plans scored (SeaLLM's search).

A planner whose :class:`~llmfleet.policies.placement.PlacementNeeds` say ``evaluator`` calls
:meth:`PlanEvaluator.evaluate` on candidate plans. The live leader does not build that evaluator: it
is given a :class:`PlanEvaluatorFactory` (the simulator's, ``llmfleet.sim.plan_eval``, chosen once
by the placement service's entry point) and hands it the cluster config, the GPU pool and the recent
workload window (:class:`WindowRequest` rows), and nothing else of the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llmfleet.policies.placement.base import GpuPool, PlanEvaluator

if TYPE_CHECKING:
    from llmfleet.config import ClusterConfig

__all__ = ["PlanEvaluator", "PlanEvaluatorFactory", "WindowRequest"]


@dataclass(frozen=True)
class WindowRequest:
    """One request of the recent workload window, as the monitor saw it."""

    arrival_s: float
    service: str
    prompt_tokens: int
    output_tokens: int


class PlanEvaluatorFactory(Protocol):
    def __call__(
        self, config: ClusterConfig, gpus: GpuPool, window: Sequence[WindowRequest]
    ) -> PlanEvaluator | None:
        """An evaluator scoring plans of ``gpus`` for the services of ``config`` on ``window``
        (arrival-ordered); None when the window holds no request of those services. The caller
        closes it."""
        ...
