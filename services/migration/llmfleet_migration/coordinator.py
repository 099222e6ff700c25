"""The migration leader's epoch loop (``llmfleet-migration --policy mell|llumnix_lb|none``).

Every ``epoch_s`` the elected leader: builds one ``GpuState`` per engine from the load streams
(``cluster_state.gpu_states``), runs the policy (the same object the simulator runs), lets the
transfer planner pick KV or token transfer within the epoch's budgets (what fits neither waits), runs
the moves (``executor``: bounded, retried, idempotent ids that carry the coordinator's epoch), and
writes ``migration_state`` (epoch, active set, the policy's dispatch view) fenced by its lease.

A new leader adopts the epoch counter and active set from ``migration_state`` and re-derives the
rest from what the engines report (the policy's view is rebuilt from the observed placement), so a
leader killed mid-epoch loses nothing: an in-flight ``Migrate`` completes or leaves the request on
its source, and the successor plans from where requests really are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmfleet.coord import EtcdClient, LeaderElection, PrefixView
from llmfleet.coord.migration_state import MigrationState, get_migration_state, write_migration_state
from llmfleet.load.monitor import LoadMonitor
from llmfleet.metrics.control import migration_metrics
from llmfleet.policies.migration import (
    EpochPlan,
    GpuState,
    MellPacker,
    Migration,
    MigrationPolicy,
    TransferBudget,
    TransferPlanner,
    migration_id,
    reprefill_boundary,
)
from llmfleet.types import NodeRecord

from llmfleet_migration.cluster_state import gpu_states
from llmfleet_migration.costs import CostModels
from llmfleet_migration.executor import MigrationExecutor, Outcome

log = logging.getLogger(__name__)


@dataclass
class EpochSummary:
    epoch: int
    time: float
    operations: int = 0
    planned: int = 0
    executed: int = 0
    failed: int = 0
    deferred: int = 0
    cancelled: int = 0
    activated: tuple[str, ...] = ()
    deactivated: tuple[str, ...] = ()
    active_engines: int = 0


@dataclass
class MigrationCoordinator:
    node_id: str
    policy_name: str
    policy: MigrationPolicy
    transfer: TransferPlanner | None
    monitor: LoadMonitor
    nodes: PrefixView[NodeRecord]
    etcd: EtcdClient
    executor: MigrationExecutor
    epoch_s: float = 1.0
    election: LeaderElection | None = None
    link_bytes_per_s: float = 1e9  # a link's bandwidth until a probe or a KV migration measured it
    probe_bytes: int = 4 << 20  # MeasureLink payload for a link a planned move uses first (0: no probes)
    probes_per_epoch: int = 4
    prefill_tokens_per_epoch: float = 2048.0  # re-prefill tokens per epoch where no cost model is known
    costs: CostModels | None = None  # per (model, hardware): the computation boundary from the cost model
    prefill_slack: float = 0.1
    stale_s: float = 5.0
    epoch: int = 0
    active: set[str] | None = None  # engines receiving new requests (None: not gated by the policy)
    epochs: deque[EpochSummary] = field(default_factory=lambda: deque(maxlen=32))
    gpus: list[GpuState] = field(default_factory=list)  # the last epoch's input (Status shows it)
    republish_epochs: int = 30  # write migration_state at least this often (else only when it changes)
    bandwidth: dict[tuple[str, str], float] = field(default_factory=dict)  # measured links (bytes/s)
    probed: set[tuple[str, str]] = field(default_factory=set)  # links probed once (measured or not)
    _probes: set[asyncio.Task] = field(default_factory=set)  # probes in flight
    _adopted: bool = False
    _published: tuple | None = None  # (active, view) last written
    _published_epoch: int = 0

    @property
    def is_leader(self) -> bool:
        return self.election is None or self.election.is_leader

    async def run(self) -> None:
        """Tick every epoch while leader (never raises; an epoch that fails is logged and retried)."""
        while True:
            await asyncio.sleep(self.epoch_s)
            if not self.is_leader:
                self._adopted = False
                continue
            try:
                if not self._adopted:
                    await self.adopt()
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("migration epoch %d failed; retrying next epoch", self.epoch + 1)

    async def adopt(self) -> None:
        """Continue the epoch counter and active set of the state in etcd (a previous leader's)."""
        state = await get_migration_state(self.etcd)
        if state is not None:
            self.epoch = max(self.epoch, state.epoch)
            if state.policy == self.policy_name and state.active is not None:
                self.active = set(state.active)
        self._adopted = True
        log.info(
            "migration leader %s adopts epoch %d (policy %s)", self.node_id, self.epoch, self.policy_name
        )

    def snapshot_states(self, now: float) -> list[GpuState]:
        snaps = {
            eid: (st.snapshot, st.received_at)
            for eid, st in self.monitor.engines.items()
            if st.snapshot is not None and st.received_at is not None and st.reporting
        }
        return gpu_states(snaps, self.nodes.snapshot(), now, active=self.active, stale_s=self.stale_s)

    def budget(self, gpus: Sequence[GpuState]) -> TransferBudget:
        """Links: measured bandwidth (else the flag) × epoch. Destinations: the re-prefill tokens whose
        marginal cost fits ``prefill_slack`` of their decode iterations (the engine's model on its
        hardware, from the profiler's record or the default cost source), else the flag."""
        prefill: dict[str, float] = {}
        nodes = self.nodes.snapshot()
        for g in gpus:
            node = nodes.get(g.gpu_id)
            cost = self.costs.get(g.models[0], node.hardware) if self.costs and node and g.models else None
            if cost is not None:
                ctx = sum(r.tokens for r in g.requests)
                prefill[g.gpu_id] = reprefill_boundary(
                    cost, len(g.requests), ctx, self.epoch_s, self.prefill_slack
                )
        links = {
            (a.gpu_id, b.gpu_id): self.bandwidth.get((a.gpu_id, b.gpu_id), self.link_bytes_per_s)
            * self.epoch_s
            for a in gpus
            for b in gpus
            if a.gpu_id != b.gpu_id
        }
        return TransferBudget(
            links, self.link_bytes_per_s * self.epoch_s, prefill, self.prefill_tokens_per_epoch
        )

    async def tick(self) -> EpochSummary:
        now = time.monotonic()
        self.epoch += 1
        gpus = self.gpus = self.snapshot_states(now)
        plan: EpochPlan = self.policy.epoch(gpus, now)
        moves = [
            dataclasses.replace(
                m,
                migration_id=f"{migration_id(m.request_id, m.source, m.destination, self.epoch)}@{self.node_id}",
            )
            for m in plan.migrations
        ]
        deferred: Sequence[Migration] = ()
        if self.transfer is not None and moves:
            if self.costs is not None:
                nodes = self.nodes.snapshot()
                await self.costs.refresh(
                    {(g.models[0], nodes[g.gpu_id].hardware) for g in gpus if g.models and g.gpu_id in nodes}
                )
            self._probe_links(moves)
            scheduled, deferred = self.transfer.assign(moves, self.budget(gpus))
            moves = list(scheduled)
        outcomes = await self.executor.run(moves) if moves else []
        self._learn_bandwidth(outcomes)
        if isinstance(self.policy, MellPacker):  # Mell gates dispatch: the open GPUs
            self.active = ({g.gpu_id for g in gpus if g.active} | set(plan.activate)) - set(plan.deactivate)
        summary = EpochSummary(
            self.epoch,
            time.time(),
            plan.operations,
            len(plan.migrations),
            sum(o.ok for o in outcomes),
            sum(o.state == "failed" for o in outcomes),
            len(deferred) + len(plan.deferred) + sum(o.state == "not yet" for o in outcomes),
            plan.cancelled,
            tuple(plan.activate),
            tuple(plan.deactivate),
            len(self.active) if self.active is not None else sum(g.active for g in gpus),
        )
        self.epochs.append(summary)
        metrics = migration_metrics()
        metrics.epochs.inc()
        metrics.epoch.set(self.epoch)
        for o in outcomes:
            metrics.migrations.labels(o.state).inc()
        if moves or plan.activate or plan.deactivate:
            log.info(
                "migration epoch %d: %d planned, %d done, %d failed, %d deferred; +%s -%s",
                self.epoch, summary.planned, summary.executed, summary.failed, summary.deferred,
                list(plan.activate), list(plan.deactivate),
            )  # fmt: skip
        await self._publish()
        return summary

    def _probe_links(self, moves: Sequence[Migration]) -> None:
        """Measure (``MeasureLink``, in the background: an epoch never waits for a probe) the links that
        planned moves use and nothing measured yet, at most ``probes_per_epoch`` per epoch and each
        once; until a result comes, a link has ``link_bytes_per_s``; finished KV moves refine it."""
        if self.probe_bytes <= 0:
            return
        fresh = [
            p
            for p in dict.fromkeys((m.source, m.destination) for m in moves)
            if p not in self.bandwidth and p not in self.probed
        ][: self.probes_per_epoch]
        if not fresh:
            return
        self.probed.update(fresh)

        async def probe() -> None:
            try:
                measured = await self.executor.measure_links(fresh, self.probe_bytes)
            except Exception as e:  # a closed channel at shutdown, an unexpected reply: links keep the flag
                log.info("link probes %s failed: %s: %s", fresh, type(e).__name__, e)
                return
            for link, bps in measured.items():
                self.bandwidth.setdefault(link, bps)  # a KV move that finished first is the better figure

        task = asyncio.create_task(probe())
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def probes_done(self) -> None:
        """Wait for the link probes in flight (an epoch does not wait for them)."""
        await asyncio.gather(*self._probes)

    def _learn_bandwidth(self, outcomes: Sequence[Outcome]) -> None:
        """A finished KV migration measures its link: bytes / transfer time (the latest wins)."""
        for o in outcomes:
            m = o.migration
            if o.ok and m.mode == "kv" and o.bytes and o.transfer_s > 0:
                self.bandwidth[(m.source, m.destination)] = o.bytes / o.transfer_s

    async def _publish(self) -> None:
        view = self.policy.view().to_json() if isinstance(self.policy, MellPacker) else {}
        key = (
            tuple(sorted(self.active)) if self.active is not None else None,
            json.dumps(view, sort_keys=True),
        )
        if key == self._published and self.epoch - self._published_epoch < self.republish_epochs:
            return
        state = MigrationState(
            self.epoch,
            self.policy_name,
            self.node_id,
            time.time(),
            tuple(sorted(self.active)) if self.active is not None else None,
            view,
        )
        guard = None
        if self.election is not None:
            if self.election.lease_id is None:
                return
            guard = (self.election.key, self.election.lease_id)
        try:
            if not await write_migration_state(self.etcd, state, leader=guard):
                log.warning("migration: leader lease changed; epoch %d state not written", self.epoch)
                return
            self._published, self._published_epoch = key, self.epoch
        except Exception as e:  # etcd down: the engines keep serving; the next epoch writes again
            log.warning("migration: writing epoch %d state failed: %s", self.epoch, e)
