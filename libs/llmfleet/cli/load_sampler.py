"""``llmfleet load`` replay: etcd read every second during the run (engines, placement plan, migration
state) and the migration leader's Status every few seconds (its epochs and moves, merged)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from llmfleet.cli.status_migration import grpc_migration_source, migration_status
from llmfleet.coord import EtcdClient
from llmfleet.coord.desired import PlanMeta, placement_meta_key
from llmfleet.coord.migration_state import MigrationState, migration_state_key
from llmfleet.replay.fleet import EngineState, FleetSample
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, NodeRecord

log = logging.getLogger(__name__)


def _parse(kind: type, raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return kind.from_json(raw)
    except (ValueError, TypeError, KeyError) as e:
        log.warning("load: undecodable %s in etcd: %s", kind.__name__, e)
        return None


@dataclass
class FleetSampler:
    """Samples the fleet into ``samples`` (t: seconds from ``t0``, a ``time.monotonic()``) every
    ``period_s`` until stopped; polls the migration leader every ``migration_every_s``."""

    client: EtcdClient
    t0: float
    period_s: float = 1.0
    migration_every_s: float = 5.0
    samples: list[FleetSample] = field(default_factory=list)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    migration_policy: str = ""
    migration_epoch_s: float = 0.0
    epochs: dict[int, dict[str, Any]] = field(default_factory=dict)
    moves: dict[str, dict[str, Any]] = field(default_factory=dict)
    migration_error: str = ""
    errors: int = 0
    _before: set[str] = field(default_factory=set)  # moves the leader reported before the run
    _polled: bool = False

    async def sample(self) -> FleetSample:
        """Read etcd once and append the sample."""
        keys = self.client.keys
        (nodes, _), (places, _), meta_raw, state_raw = await asyncio.gather(
            self.client.get_prefix(keys.nodes),
            self.client.get_prefix(keys.placements),
            self.client.get(placement_meta_key(self.client)),
            self.client.get(migration_state_key(self.client)),
        )
        t = time.monotonic() - self.t0
        records = [r for r in (_parse(NodeRecord, v) for v in nodes.values()) if r is not None]
        self.nodes = {r.node_id: r for r in records}
        engines = tuple(
            EngineState(r.node_id, max(int(r.tp), 1), r.hardware, tuple(r.models))
            for r in sorted(records, key=lambda r: r.node_id)
            if r.role == ENGINE_ROLE
        )
        placement: dict[str, tuple[str, ...]] = {}
        for v in places.values():
            p = _parse(DesiredPlacement, v)
            if p is not None:
                placement[p.engine_id] = tuple(m.name for m in p.models)
        meta: PlanMeta | None = _parse(PlanMeta, meta_raw)
        state: MigrationState | None = _parse(MigrationState, state_raw)
        s = FleetSample(
            t, engines, placement,
            plan_id=meta.plan_id if meta else None, plan_policy=meta.policy if meta else "",
            plan_reason=meta.reason if meta else "",
            migration_epoch=state.epoch if state else None, migration_policy=state.policy if state else "",
            active=state.active if state else None,
        )  # fmt: skip
        self.samples.append(s)
        return s

    async def poll_migration(self, timeout: float = 2.0) -> None:
        """Merge the migration leader's recent epochs and moves (best effort)."""
        raw = await self.client.get(self.client.keys.leader("migration"))
        leader = raw.decode() if raw is not None else None
        status = await migration_status(leader, self.nodes, grpc_migration_source(timeout))
        if status.error:
            self.migration_error = status.error
            return
        self.migration_error = ""
        self.migration_policy, self.migration_epoch_s = status.policy, status.epoch_s
        start_unix = time.time() - (time.monotonic() - self.t0)
        for e in status.epochs:
            if e.time >= start_unix:  # the leader also remembers epochs from before the run
                self.epochs[e.epoch] = dataclasses.asdict(e)
        if not self._polled:
            self._polled = True
            self._before = {m.migration_id for m in status.recent}
        for m in status.recent:
            if m.migration_id not in self._before:
                self.moves[m.migration_id] = dataclasses.asdict(m)

    async def run(self, stop: asyncio.Event) -> None:
        """Sample until ``stop`` is set, then once more (the state at the end)."""
        next_migration = 0.0
        while True:
            started = time.monotonic()
            try:
                await self.sample()
                if started - self.t0 >= next_migration:
                    next_migration = started - self.t0 + self.migration_every_s
                    await self.poll_migration()
            except Exception as e:  # etcd blip: the run goes on, the gap shows in the samples
                self.errors += 1
                log.warning("load: fleet sample failed: %s", e)
            if stop.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, self.period_s - (time.monotonic() - started)))

    async def finish(self) -> None:
        """A last sample and migration poll once the run has ended."""
        with contextlib.suppress(Exception):
            await self.sample()
        with contextlib.suppress(Exception):
            await self.poll_migration()
