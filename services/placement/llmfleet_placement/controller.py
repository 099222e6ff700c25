"""The leader's reconcile loop: make etcd's services/ match the cluster config and, with the static
policy, placement/ match its ``engines:`` (a planner's placement/ is ``live.LivePlacementLoop``'s)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from llmfleet.config import ClusterConfig
from llmfleet.coord import (
    EtcdClient,
    PrefixView,
    delete_placement,
    delete_service,
    put_placement,
    put_service,
)
from llmfleet.policies.placement import StaticConfigPlacement
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, NodeRecord, ServiceSpec

log = logging.getLogger(__name__)


@dataclass
class PlacementController:
    config: ClusterConfig
    etcd: EtcdClient
    placement_view: PrefixView[DesiredPlacement]
    services_view: PrefixView[ServiceSpec]
    nodes_view: PrefixView[NodeRecord]
    resync_s: float = 5.0
    manage_placement: bool = True  # False: services/ only (a planner owns placement/)
    policy: StaticConfigPlacement = field(init=False)

    def __post_init__(self) -> None:
        self.policy = StaticConfigPlacement(tuple(self.config.placements()))

    async def reconcile_once(self) -> int:
        """Write what differs between the plan and etcd; returns the number of keys changed."""
        changed = 0
        want: dict[str, ServiceSpec] = {s.name: s for s in self.config.service_specs()}
        have = self.services_view.snapshot()
        for name, spec in sorted(want.items()):
            if have.get(name) != spec:
                await put_service(self.etcd, spec)
                changed += 1
        for name in sorted(set(have) - set(want)):
            await delete_service(self.etcd, name)
            changed += 1
        if not self.manage_placement:
            if changed:
                log.info("placement: wrote %d service keys", changed)
            return changed
        live = [n.node_id for n in self.nodes_view.snapshot().values() if n.role == ENGINE_ROLE]
        diff = self.policy.diff(self.placement_view.snapshot(), live)
        for p in diff.put:
            await put_placement(self.etcd, p)
        for eid in diff.delete:
            await delete_placement(self.etcd, eid)
        changed += len(diff.put) + len(diff.delete)
        if changed:
            log.info("placement: wrote %d desired-state keys", changed)
        return changed

    async def run(self) -> None:
        """Reconcile now, then whenever the desired state is touched by someone else, and every resync_s."""
        changes = asyncio.Queue[int]()

        async def pump(view: PrefixView) -> None:
            async for rev, _ in view.subscribe():
                changes.put_nowait(rev)

        watched = (
            (self.placement_view, self.services_view) if self.manage_placement else (self.services_view,)
        )
        pumps = [asyncio.create_task(pump(v)) for v in watched]
        try:
            while True:
                try:
                    await self.reconcile_once()
                except Exception as e:  # etcd hiccup: try again on the next tick
                    log.warning("placement reconcile failed: %s", e)
                try:
                    await asyncio.wait_for(changes.get(), timeout=self.resync_s)
                    await asyncio.sleep(0.05)  # coalesce bursts (our own writes echo back)
                    while not changes.empty():
                        changes.get_nowait()
                except TimeoutError:
                    pass
        finally:
            for p in pumps:
                p.cancel()
