"""Where the live placement loop reads the demand from.

The loop only needs :class:`WorkloadSource` (``loads(now)``: one :class:`ServiceLoad` per service,
served model names, ``now`` on the source's clock) and, for planners that score candidate plans by
simulation (SeaLLM), optionally :class:`EvaluatorSource`. :class:`MonitorWorkload` adapts the service
monitor the schedulers feed (``llmfleet.monitor.FleetMonitor`` on the placement servicer) and, given
the cluster config, scores plans with the simulator (``SimPlanEvaluator``) on the monitor's recent
completed requests (their arrival times, prompt and output lengths), the services' SLOs and catalog
models as ``llmfleet sim --cluster-config`` reads them, the engines' local policy and round-robin
dispatch. :class:`NoTraffic` is the stand-in when there is no monitor (every service at rate 0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from llmfleet.config import ClusterConfig
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
    config: ClusterConfig | None = None  # enables evaluator() (the services' catalog models and SLOs)
    placement: str = "seallm"  # the planner whose candidates are scored (the simulator's bundle name)
    dispatch: str = "round_robin"  # the schedulers' dispatch, as the simulator runs it

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
        """A simulator scoring plans on the recent completed requests (None: none, or no config)."""
        if self.config is None:
            return None
        from llmfleet.costmodel.hardware import hardware
        from llmfleet.sim.plan_eval import SimPlanEvaluator
        from llmfleet.sim.run import PolicyBundle
        from llmfleet.sim.spec import ClusterSpec, SimSpec, from_cluster_config
        from llmfleet.workload import WorkloadRequest

        services, engine = from_cluster_config(self.config)
        catalog = {s.name: s.model for s in services}
        samples = sorted(
            (r.arrival_s, st.service, r)
            for st in self.monitor.stats(now)
            if st.service in catalog
            for r in st.samples
        )
        if not samples:
            return None
        t0 = samples[0][0]
        requests = [
            WorkloadRequest(
                f"{svc}-{i}", t - t0, max(0, r.prompt_tokens), max(1, r.output_tokens), svc, catalog[svc]
            )
            for i, (t, svc, r) in enumerate(samples)
        ]
        local = {e.policy for e in self.config.engines.values()}
        bundle = PolicyBundle(
            "live",
            placement=self.placement,
            dispatch=self.dispatch,
            local=local.pop() if len(local) == 1 else "fcfs",
        )
        spec = SimSpec(ClusterSpec(gpus.count, hardware(gpus.hardware)), services, engine)
        return SimPlanEvaluator(spec, requests, bundle)


@dataclass
class NoTraffic:
    """No monitor: every service is reported at rate 0 (planners then give each its minimum)."""

    def loads(self, now: float) -> list[ServiceLoad]:
        return []
