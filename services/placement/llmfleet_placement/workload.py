"""Where the live placement loop reads the demand from.

The loop only needs :class:`WorkloadSource` (``loads(now)``: one :class:`ServiceLoad` per service,
served model names, ``now`` on the source's clock) and, for planners that score candidate plans by
simulation (SeaLLM), optionally :class:`EvaluatorSource`. :class:`MonitorWorkload` adapts the service
monitor the schedulers feed (``llmfleet.monitor.FleetMonitor`` on the placement servicer);
:class:`NoTraffic` is the stand-in when there is none (every service at rate 0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from llmfleet.policies.placement import GpuPool, PlanEvaluator, ServiceLoad
from llmfleet.types import ServiceSpec, Slo


@runtime_checkable
class WorkloadSource(Protocol):
    def loads(self, now: float) -> list[ServiceLoad]:
        """The services' current demand (a service with no traffic may be left out: rate 0)."""
        ...


@runtime_checkable
class ReportingSource(Protocol):
    def has_data(self, now: float) -> bool:
        """Whether anyone reports demand now (a new leader's monitor is empty until the schedulers'
        next reports reach it)."""
        ...


@runtime_checkable
class EvaluatorSource(Protocol):
    def evaluator(self, now: float, gpus: GpuPool) -> PlanEvaluator | None:
        """Scores candidate plans on the recent workload (None: no recent workload to replay)."""
        ...


class _Monitor(Protocol):
    def age_s(self, now: float) -> float: ...

    def loads(
        self,
        now: float,
        slos: Mapping[str, Slo],
        *,
        models: Mapping[str, str] | None = None,
        window_s: float | None = None,
    ) -> list[ServiceLoad]: ...


@dataclass
class MonitorWorkload:
    """The service monitor's view of ``services`` (a callable: the services can change)."""

    monitor: _Monitor
    services: Callable[[], list[ServiceSpec]]
    window_s: float | None = None

    def loads(self, now: float) -> list[ServiceLoad]:
        specs = self.services()
        return self.monitor.loads(
            now,
            {s.name: s.slo for s in specs},
            models={s.name: s.model for s in specs},
            window_s=self.window_s,
        )

    def has_data(self, now: float) -> bool:
        return self.monitor.age_s(now) < float("inf")


@dataclass
class NoTraffic:
    """No monitor: every service is reported at rate 0 (planners then give each its minimum)."""

    def loads(self, now: float) -> list[ServiceLoad]:
        return []
