"""Where the live placement loop reads the demand from.

The loop only needs :class:`WorkloadSource` (``loads(now)``: one :class:`ServiceLoad` per service,
served model names, ``now`` on the source's clock) and, for planners that score candidate plans by
simulation (SeaLLM), optionally :class:`EvaluatorSource`. :class:`MonitorWorkload` adapts the service
monitor the schedulers feed (``llmfleet.monitor.FleetMonitor`` on the placement servicer) and, given
the cluster config and a :class:`~llmfleet.policies.placement.evaluator.PlanEvaluatorFactory` (the
simulator's, ``llmfleet.sim.plan_eval.ClusterPlanEvaluators``, chosen in ``main``), scores plans on the
monitor's recent requests. The recent requests are the window's arrivals, as the simulator's placement
loop replays them: the completed ones with their arrival times and lengths, and
those that arrived but have not finished (queued or still running; an overloaded service has many)
with the mean lengths of the service's completed ones, spread evenly over the window. Without them an
overloaded service would look idle to the search, and get less the more it needs.
:class:`NoTraffic` is the stand-in when there is no monitor (every service at rate 0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from llmfleet.config import ClusterConfig
from llmfleet.policies.placement import GpuPool, PlanEvaluator, ServiceLoad
from llmfleet.policies.placement.evaluator import PlanEvaluatorFactory, WindowRequest
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import Slo


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
class InfeasibleSource(Protocol):
    def infeasible(self, now: float) -> dict[str, int]:
        """Per service: requests the schedulers' dispatch found no feasible worker for (cumulative)."""
        ...


@runtime_checkable
class EvaluatorSource(Protocol):
    def evaluator(self, now: float, gpus: GpuPool) -> PlanEvaluator | None:
        """Scores candidate plans on the recent workload (None: no recent workload to replay)."""
        ...


class _Monitor(Protocol):
    def age_s(self, now: float) -> float: ...

    def stats(self, now: float) -> list: ...

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
    config: ClusterConfig | None = None  # with evaluators, enables evaluator() (the services and SLOs)
    evaluators: PlanEvaluatorFactory | None = None  # builds the plan scorer (the simulator's, given by main)

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

    def infeasible(self, now: float) -> dict[str, int]:
        return {s.service: s.infeasible for s in self.monitor.stats(now)}

    def evaluator(self, now: float, gpus: GpuPool) -> PlanEvaluator | None:
        """Scores plans on the recent requests (None: none, or no config or evaluator factory)."""
        if self.config is None or self.evaluators is None:
            return None
        window = [WindowRequest(*row) for row in recent_requests(self.monitor.stats(now), now, self.window_s)]
        return self.evaluators(self.config, gpus, window)


def recent_requests(stats: list, now: float, window_s: float | None) -> list[tuple[float, str, int, int]]:
    """(arrival, service, prompt tokens, output tokens) of the window's arrivals, by arrival: each
    completed sample as it was, and per service ``arrivals − finished`` more requests that have not
    finished, with that service's mean completed lengths (none completed: the window's means, else
    skipped), evenly over the window's observed span (their arrival times are not reported)."""
    rows = [
        (r.arrival_s, st.service, max(0, r.prompt_tokens), max(1, r.output_tokens))
        for st in stats
        for r in st.samples
    ]
    for st in stats:
        w = st.window(window_s)
        missing = w.arrivals - w.finished
        if missing <= 0 or w.span_s <= 0:
            continue
        if st.samples:
            prompt = sum(r.prompt_tokens for r in st.samples) / len(st.samples)
            output = sum(r.output_tokens for r in st.samples) / len(st.samples)
        elif w.completed:
            prompt, output = w.prompt_tokens.mean, w.output_tokens.mean
        else:
            continue  # nothing known of this service's lengths yet
        step = w.span_s / missing
        rows += [
            (now - w.span_s + (k + 0.5) * step, st.service, max(0, round(prompt)), max(1, round(output)))
            for k in range(missing)
        ]
    return sorted(rows, key=lambda r: (r[0], r[1]))


@dataclass
class NoTraffic:
    """No monitor: every service is reported at rate 0 (planners then give each its minimum)."""

    def loads(self, now: float) -> list[ServiceLoad]:
        return []
