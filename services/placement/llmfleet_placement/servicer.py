"""Placement gRPC shell: GetPlan reports desired vs loaded models per engine, the engine pool (GPUs in
use), the leader's recent decisions and the merged service monitor; ReportStats feeds the monitor.

The servicer owns the two things the control loop reads and writes besides etcd: ``monitor`` (the
schedulers' reports merged per service: ``monitor.loads(now, slos)`` is the planners' input; ``now``
on ``time.monotonic()``) and ``decisions`` (append a :class:`~llmfleet.monitor.Decision` per run).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field

import grpc
from llmfleet.api.v1 import engine_pb2, placement_pb2, placement_pb2_grpc
from llmfleet.coord import LeaderElection, PrefixView
from llmfleet.monitor import Decision, FleetMonitor, ServiceStats, decision_log, engine_pool
from llmfleet.monitor.wire import (
    BadReport,
    decision_to_proto,
    pool_to_proto,
    stats_from_proto,
    stats_to_proto,
)
from llmfleet.types import DesiredPlacement, NodeRecord

log = logging.getLogger(__name__)

LEADER_CACHE_S = 1.0  # how long ReportStats acks reuse the leader id read from etcd


@dataclass
class DemandWake:
    """Which stats reports wake the leader's loop: cold requests (every report while they wait), or
    held requests that were not held in the scheduler's previous report (a queue starting to build)."""

    held: dict[tuple[str, str], int] = field(default_factory=dict)  # (scheduler, service) -> held

    def wakes(self, scheduler: str, services: list[ServiceStats]) -> bool:
        wake = False
        for s in services:
            before = self.held.get((scheduler, s.service), 0)
            self.held[(scheduler, s.service)] = s.held
            wake |= s.cold > 0 or (s.held > 0 and before == 0)
        return wake


@dataclass
class PlacementServicer(placement_pb2_grpc.PlacementServicer):
    node_id: str
    election: LeaderElection | None = None  # set once etcd is reached
    placement_view: PrefixView[DesiredPlacement] | None = None
    nodes_view: PrefixView[NodeRecord] | None = None
    views: tuple[PrefixView, ...] = ()
    monitor: FleetMonitor = field(default_factory=FleetMonitor)
    decisions: deque[Decision] = field(default_factory=decision_log)
    # set when a report carries requests waiting for a model no engine hosts (scale from zero), or a
    # service whose requests the scheduler began to hold (every engine saturated: a burst): the
    # leader's loop plans at once instead of at its next interval
    demand: asyncio.Event = field(default_factory=asyncio.Event)
    wake: DemandWake = field(default_factory=DemandWake)
    _leader: tuple[float, str] = (-1e18, "")  # (read at, leader id)

    async def shutdown(self) -> None:
        """Hand leadership over at once (resign) and stop the watches (the campaign is cancelled first)."""
        if self.election is not None:
            with contextlib.suppress(Exception):
                await self.election.resign()
        for v in self.views:
            await v.stop()

    async def GetPlan(self, request: placement_pb2.GetPlanRequest, context: grpc.aio.ServicerContext):
        if self.election is None or self.placement_view is None or self.nodes_view is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "placement is not connected to etcd yet; retry")
        try:
            leader = await self.election.observe()
        except Exception as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"etcd unavailable: {e}")
        nodes = self.nodes_view.snapshot()
        desired = self.placement_view.snapshot()
        plan = placement_pb2.PlacementPlan(
            leader_id=leader or "", is_leader=self.election.is_leader, revision=self.placement_view.revision
        )
        for eid, p in sorted(desired.items()):
            node = nodes.get(eid)
            plan.engines.add(
                engine_id=eid,
                models=[engine_pb2.ModelSpec(name=m.name, source=m.source, dtype=m.dtype) for m in p.models],
                loaded=list(node.models) if node else [],
            )
        pool_to_proto(engine_pool(nodes.values(), desired), plan)
        plan.decisions.extend(decision_to_proto(d) for d in self.decisions)
        now = time.monotonic()
        plan.services.extend(stats_to_proto(s, now, samples=False) for s in self.monitor.stats(now))
        return plan

    async def ReportStats(self, request_iterator, context: grpc.aio.ServicerContext):
        """One ack per report; a malformed report is refused in its ack (the stream goes on)."""
        async for report in request_iterator:
            now = time.monotonic()
            ack = placement_pb2.ReportStatsAck(seq=report.seq)
            try:
                if not report.scheduler_id:
                    raise BadReport("a report needs its scheduler_id")
                services = [stats_from_proto(s, now) for s in report.services]
                if len({s.service for s in services}) != len(services):
                    raise BadReport("a service appears twice in one report")
            except BadReport as e:
                log.warning("stats report %d from %r refused: %s", report.seq, report.scheduler_id, e)
                ack.accepted, ack.error = False, str(e)
            else:
                interval = report.interval_s if math.isfinite(report.interval_s) else 0.0
                self.monitor.update(report.scheduler_id, services, now, report.seq, interval)
                ack.accepted = True
                if self.wake.wakes(report.scheduler_id, services):
                    self.demand.set()
            ack.is_leader = self.election is not None and self.election.is_leader
            ack.leader_id = self.node_id if ack.is_leader else await self._leader_id(now)
            yield ack

    async def _leader_id(self, now: float) -> str:
        """The leader's id (cached ``LEADER_CACHE_S``; "" when unknown or etcd is unreachable)."""
        at, leader = self._leader
        if now - at < LEADER_CACHE_S or self.election is None:
            return leader
        try:
            leader = await self.election.observe(timeout=1.0) or ""
        except Exception as e:
            log.debug("leader lookup failed: %s", e)
            leader = ""
        self._leader = (now, leader)
        return leader
