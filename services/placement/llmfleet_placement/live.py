"""The placement leader's live loop: every interval, plan over the monitored workload and the live engine
pool, and write the desired state when it changes.

One tick: engines from ``nodes/`` (id, tp, hardware, hosted models) and ``placement/`` → a
:class:`GpuPool`; demand from the :class:`WorkloadSource`; ``planner.place``; ``assign_plan`` onto
the live engines with the fewest moves (idle engines get ``()``); if the result differs from the
desired state and :class:`Hysteresis` agrees, every ``placement/*`` key and ``placement_meta`` (plan
id, policy, reason) are written in ONE transaction fenced by our leader lease. Engines converge on
their own (load first, drain, unload: ``llmfleet_engine.placement_follower``).

An infeasible plan (``PlacementInfeasible``, e.g. a model larger than any engine) is logged and
recorded as a failed decision; the last good plan stays. Every decision goes to the log and to
``decisions`` (GetPlan, ``llmfleet status``).

The services planned for are etcd's ``services/`` (with ``models/``) read every tick through
``desired`` (``controller.read_runtime_config``): services applied or deleted at runtime are placed or
released on the next tick; a service that cannot be planned (undeclared model, no catalog name) is
left out and recorded as a failed decision naming it. Without ``desired`` (tests) the config's own.

Failover: a new leader adopts the plan in etcd (``placement_meta``) as its current plan and does not
plan before one full interval, so a replacement in progress completes under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from llmfleet.config import ClusterConfig
from llmfleet.coord import EtcdClient, LeaderElection, PrefixView
from llmfleet.coord.desired import PlanMeta, get_placement_meta, write_plan
from llmfleet.coord.unplaced import UnplacedPublisher
from llmfleet.metrics.control import placement_metrics
from llmfleet.monitor import Decision
from llmfleet.policies.placement import PlacementContext, PlacementInfeasible, PlacementPlanner, ServiceLoad
from llmfleet.policies.placement.hysteresis import Hysteresis, grows_for, newly_served
from llmfleet.types import DesiredPlacement, NodeRecord

from llmfleet_placement.controller import unplaced_models
from llmfleet_placement.planning import (
    LiveEngine,
    ModelNames,
    PlanResult,
    current_instances,
    current_state,
    describe_change,
    describe_loads,
    gpu_pool,
    infeasible_since,
    live_engines,
    plan_target,
    planner_loads,
    uncovered,
)
from llmfleet_placement.workload import (
    EvaluatorSource,
    InfeasibleSource,
    MonitorWorkload,
    NoTraffic,
    ReportingSource,
    WorkloadSource,
)

log = logging.getLogger(__name__)

RETRY_SOON_S = 0.5  # while the engines are registering, the loop looks again this often (start-up)


@dataclass
class LivePlacementLoop:
    config: ClusterConfig
    etcd: EtcdClient
    placement_view: PrefixView[DesiredPlacement]
    nodes_view: PrefixView[NodeRecord]
    planner: PlacementPlanner
    policy: str
    interval_s: float
    leader_id: str = ""
    workload: WorkloadSource = field(default_factory=NoTraffic)
    decisions: deque[Decision] = field(default_factory=lambda: deque(maxlen=100))
    election: LeaderElection | None = None  # fences the plan writes with our leader lease
    clock: Callable[[], float] = time.monotonic  # the workload's clock (the planners' "now")
    wall: Callable[[], float] = time.time  # decision timestamps
    plan_id: int = 0  # the plan in force (placement_meta); 0: none written by a planner yet
    # a new term with a plan in force does not plan on an empty monitor for this long (the schedulers'
    # reports reach a new leader within their interval; FleetMonitor forgets reports after 10 s)
    monitor_grace_s: float = 10.0
    # the services to plan for, read every tick: (config with etcd's services/models, problems), or
    # None while services/ is not seeded (no tick); unset: ``config`` as given
    desired: Callable[[], Awaitable[tuple[ClusterConfig, list[str]] | None]] | None = None
    # set by whoever learns of requests waiting for capacity (the servicer, from the schedulers'
    # reports: an unhosted model, or a queue starting to build): the loop plans at once
    wake: asyncio.Event | None = None
    names: ModelNames = field(init=False)
    hysteresis: Hysteresis = field(init=False)
    _last_error: str = ""
    term_start: float | None = None  # when this leadership term began (run): the monitor's grace runs from it
    _infeasible_seen: dict[str, int] = field(default_factory=dict)  # per service, the last cumulative count
    _desired_problems: tuple[str, ...] = ()
    _unplaced: UnplacedPublisher | None = None
    # the last tick found services/ unseeded or the engines still registering: the next after RETRY_SOON_S
    retry_soon: bool = False

    def __post_init__(self) -> None:
        self.names = ModelNames(self.config.catalog_models(), self.config.adapter_bases())
        self.hysteresis = Hysteresis(self.config.placement.confirm_intervals)

    async def run(self) -> None:
        """Adopt the plan in etcd, then tick every ``interval_s`` (first tick at once only when there
        is no plan to adopt)."""
        self.term_start = self.clock()
        placement_metrics().leader_changes.inc()  # run() is one leadership term
        await asyncio.gather(self.placement_view.ready.wait(), self.nodes_view.ready.wait())
        if await self.adopt():
            await self.wait_interval()
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # etcd hiccup, a planner bug: keep the plan, try next interval
                log.exception("placement tick failed")
                self._failed(f"placement tick failed: {e}")
            await self.wait_interval()

    async def wait_interval(self) -> None:
        """One interval, cut short by ``wake`` (requests wait for capacity: an unhosted model, a burst)."""
        interval = min(self.interval_s, RETRY_SOON_S) if self.retry_soon else self.interval_s
        if self.wake is None:
            await asyncio.sleep(interval)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), interval)
        if self.wake.is_set():
            log.info("placement: requests wait for capacity (an unhosted model or a burst); planning now")
        self.wake.clear()

    async def adopt(self) -> bool:
        """Take the plan in etcd as the current one; True if there was one."""
        meta = await get_placement_meta(self.etcd)
        self.hysteresis.reset()
        if meta is not None:
            self.plan_id = meta.plan_id
            placement_metrics().plan_id.set(meta.plan_id)
            self._record(
                Decision(
                    self.wall(),
                    self.policy,
                    f"adopted plan #{meta.plan_id} ({meta.policy}, by {meta.leader or '?'}): {meta.summary}",
                    f"new leader {self.leader_id}; first plan after {self.interval_s:g}s",
                )
            )
            return True
        return bool(self.placement_view.snapshot())  # keys without meta (e.g. the static policy's)

    async def refresh_services(self) -> bool:
        """Take the services (and models) to plan for from ``desired``; False: nothing to plan yet."""
        if self.desired is None:
            return True
        got = await self.desired()
        if got is None:
            log.info("placement: services/ not seeded yet; not planning")
            return False
        config, problems = got
        if config.services != self.config.services or config.models != self.config.models:
            self.names = ModelNames(config.catalog_models(), config.adapter_bases())
            if isinstance(self.workload, MonitorWorkload):  # the monitor's view follows the services
                self.workload.services = config.service_specs
                if self.workload.config is not None:
                    self.workload.config = config
        self.config = config
        await self._publish_unplaced(unplaced_models(problems))
        if tuple(problems) != self._desired_problems:
            self._desired_problems = tuple(problems)
            for p in problems:
                log.error("placement (%s): %s; the service is not planned for", self.policy, p)
            if problems:
                why = "; ".join(problems)
                self.decisions.append(
                    Decision(self.wall(), self.policy, "services left out of the plan", why, False, why)
                )
        return True

    async def tick(self) -> PlanResult | None:
        """One planning round; the plan it applied (None: nothing written)."""
        if not await self.refresh_services():
            self.retry_soon = True  # the controller seeds services/ at start: look again shortly
            return None
        now = self.clock()
        placements = self.placement_view.snapshot()
        engines = live_engines(self.nodes_view.snapshot().values(), placements)
        if not self._engines_ready(now, engines):
            return None
        if self._waiting_for_reports(now, placements):
            log.info("placement: waiting for the schedulers' first reports before planning")
            return None
        planned = await self._plan(now, engines)
        if planned is None:
            return None
        result, loads, reason = planned
        current = current_state(engines)
        if result.target == current:
            self.hysteresis.reset()
            self._last_error = ""
            log.debug("placement: plan unchanged (%s)", reason)
            return None
        needed = {self.names.host(s.model) for s in self.config.service_specs()}  # adapters: their bases
        held = {
            self.names.host(self.config.services[s.name].model)
            for s in loads
            if s.held and s.name in self.config.services
        }
        urgent = bool(newly_served(current, result.target, needed) or grows_for(current, result.target, held))
        change = describe_change(current, result.target)
        if not self.hysteresis.decide(result.target, urgent):
            if self.hysteresis.seen == 1:  # once per new proposal
                self._record(
                    Decision(
                        self.wall(),
                        self.policy,
                        f"proposed {change}; applied if proposed for {self.hysteresis.confirm} intervals",
                        reason,
                    )
                )
            return None
        if urgent:
            unserved = sorted(set(uncovered(current, needed)))
            reason += f"; unserved: {', '.join(unserved)}" if unserved else "; requests held for capacity"
        return result if await self.apply(result, engines, placements, change, reason) else None

    def _engines_ready(self, now: float, engines: list[LiveEngine]) -> bool:
        """Whether to plan on ``engines`` now. At start-up, while the configured engines are still
        registering (within the grace), look again shortly rather than in one interval, and do not plan
        on part of the pool yet; no engine after the grace is a failed round."""
        starting = now - (self.term_start if self.term_start is not None else now) < self.monitor_grace_s
        expected = (
            self.config.emulated.count if self.config.emulated is not None else len(self.config.engines)
        )
        self.retry_soon = not engines or (starting and len(engines) < expected and not self.plan_id)
        if not engines:
            if starting:
                log.info("placement: no live engine yet; waiting for engines to register")
            else:
                self._failed("no live engines to place on")
            return False
        if self.retry_soon:
            log.info("placement: %d of %d engines registered; waiting for the rest", len(engines), expected)
            return False
        return True

    async def _plan(
        self, now: float, engines: list[LiveEngine]
    ) -> tuple[PlanResult, list[ServiceLoad], str] | None:
        """Run the planner over the monitored demand and the live pool (off the event loop): its plan,
        the loads it planned for and the reason so far; None (recorded as failed) when it cannot."""
        cfg = self.config.placement
        pool, note = gpu_pool(engines, cfg.hardware, cfg.gpus_per_node, self.config.planned_engines())
        specs = self.config.service_specs()
        try:
            loads = planner_loads(self.workload.loads(now), specs, self.names, drain_s=self.interval_s)
        except ValueError as e:
            self._failed(str(e))
            return None
        reason = describe_loads(loads) + (f"; {note}" if note else "")
        evaluator = None
        if self.planner.needs.evaluator and isinstance(self.workload, EvaluatorSource):
            evaluator = self.workload.evaluator(now, pool)
        # no recent workload: the planner still places what nobody hosts (SeaLLM §4's minimal dedicated
        # GPUs for a new service), so a fresh fleet is served before its first request
        cold = self.planner.needs.evaluator and evaluator is None
        infeasible = (
            infeasible_since(self.workload.infeasible(now), self._infeasible_seen, specs, self.names)
            if isinstance(self.workload, InfeasibleSource)
            else {}
        )
        context = PlacementContext(
            current=current_instances(engines, self.names),
            evaluator=evaluator,
            now=now,
            infeasible=infeasible,
        )
        try:  # a search can take seconds: off the event loop (the leader lease is kept alive on it)
            result = await asyncio.to_thread(
                plan_target, self.planner, pool, loads, engines, self.names, context
            )
        except (PlacementInfeasible, ValueError) as e:
            if cold:
                self._failed(
                    f"policy {self.policy} scores plans by simulation but has no recent workload", reason
                )
            else:
                self._failed(f"infeasible plan: {e}", reason)
            return None
        finally:
            if evaluator is not None:
                evaluator.close()
        why = self.planner.last_reason  # the planner's own account, when it gives one
        if why:
            reason += f"; {self.policy}: {why}"
        return result, loads, reason

    async def apply(
        self,
        result: PlanResult,
        engines: list[LiveEngine],
        placements: dict[str, DesiredPlacement],
        change: str,
        reason: str,
    ) -> bool:
        """Write the whole desired state (changed keys, dead engines' keys deleted, meta) in one txn."""
        want = {
            eid: DesiredPlacement(eid, tuple(self.config.model_spec(m) for m in models))
            for eid, models in result.target.items()
        }
        put = [p for eid, p in sorted(want.items()) if placements.get(eid) != p]
        delete = sorted(set(placements) - set(want))
        before = sum(e.tp for e in engines if e.effective)
        summary = f"{change}; GPUs {before} -> {result.gpus_in_use}"
        meta = PlanMeta(
            self.plan_id + 1, self.policy, reason, summary, self.leader_id, self.wall(), result.gpus_in_use
        )
        guard = None
        if self.election is not None:
            if not self.election.is_leader or self.election.lease_id is None:
                log.warning("placement: not the leader any more; plan #%d not written", meta.plan_id)
                return False
            guard = (self.election.key, self.election.lease_id)
        if not await write_plan(self.etcd, put, delete, meta, leader=guard):
            log.warning("placement: leader lease changed; plan #%d not written", meta.plan_id)
            return False
        self.plan_id = meta.plan_id
        self._last_error = ""
        m = placement_metrics()
        m.changes.inc()
        m.plan_id.set(meta.plan_id)
        self._record(Decision(meta.time, self.policy, f"plan #{meta.plan_id}: {summary}", reason))
        return True

    async def _publish_unplaced(self, models: dict[str, str]) -> None:
        """Tell the schedulers which models will not be placed (``coord.unplaced``), when it changes."""
        if self._unplaced is None:
            self._unplaced = UnplacedPublisher(self.etcd, self.election)
        await self._unplaced.publish(models)

    def _waiting_for_reports(self, now: float, placements: dict[str, DesiredPlacement]) -> bool:
        """A plan is in force and the monitor has heard nobody yet this term (within the grace)."""
        if not isinstance(self.workload, ReportingSource) or self.workload.has_data(now):
            return False
        if not (self.plan_id or placements):
            return False  # nothing in force: plan for zero traffic now
        start = self.term_start if self.term_start is not None else now
        return now - start < self.monitor_grace_s

    def _failed(self, error: str, reason: str = "") -> None:
        """A round that could not plan: logged every time, recorded once until the error changes."""
        log.error("placement (%s): %s; the last good plan stays", self.policy, error)
        if error != self._last_error:
            self._last_error = error
            self.decisions.append(Decision.failed(self.wall(), self.policy, error, reason))

    def _record(self, d: Decision) -> None:
        log.info("placement decision (%s): %s [%s]", d.policy, d.summary, d.reason)
        self.decisions.append(d)
