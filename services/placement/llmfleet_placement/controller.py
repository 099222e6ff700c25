"""The leader's reconcile loop: seed etcd's services/ and models/ from the cluster config ONCE, and,
with the static policy, make placement/ match the config's ``engines:`` (a planner's placement/ is
``live.LivePlacementLoop``'s).

Bootstrap semantics (the cluster file is the bootstrap, etcd is the truth afterwards):

* The first leader to find no ``services_seeded`` marker writes the config's services and models that
  etcd does not hold yet, together with the marker, in ONE transaction (each written key must still be
  absent, so an ``llmfleet apply`` racing the seeding is never overwritten).
* After that the leader never writes ``services/`` or ``models/``: services added, changed or deleted at
  runtime (``llmfleet apply``, ``llmfleet services delete``) are never reverted, by a resync, a
  restart or a failover. Editing the cluster file's ``services:`` later does nothing by itself; the
  leader logs the difference. Apply the file (``llmfleet apply -f cluster.yaml``, the same shape) or
  start the placement service with ``--reseed``.
* ``--reseed`` (explicit, once per process): replace ``services/`` and ``models/`` with exactly the
  config's, and rewrite the marker.

Why not "add the config's missing services on every resync"? Because then ``llmfleet services delete``
of a service the file also lists would be undone by the next resync or failover: a platform team
expects a delete to stick, and the file to be a starting point, as with kubeadm's init config or
etcd's ``--initial-cluster`` (ignored once the data exists).

Static placement: a runtime service whose model is on some engine's ``models:`` list is served by
those engines at once (the scheduler follows ``services/``); one whose model is on no engine's list
stays unplaced (``llmfleet services list`` shows it; logged once here): the static policy places only
what the file lists. Use a planner policy to place runtime models.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmfleet.config import ClusterConfig
from llmfleet.coord import (
    EtcdClient,
    LeaderElection,
    PrefixView,
    delete_placement,
    put_placement,
)
from llmfleet.coord.desired import ModelEntry, SeedRecord, get_seed, seed_desired
from llmfleet.coord.unplaced import UnplacedPublisher
from llmfleet.costmodel import UnknownModel, model_arch
from llmfleet.policies.placement import StaticConfigPlacement
from llmfleet.spec.services import ModelConfig, ServiceSpec
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, NodeRecord

log = logging.getLogger(__name__)


class LeftOut(str):
    """A problem that leaves a service out of the plan (its text), naming the service and its model."""

    service: str
    model: str

    def __new__(cls, text: str, service: str, model: str) -> LeftOut:
        self = super().__new__(cls, text)
        self.service, self.model = service, model
        return self


def unplaced_models(problems: list[str]) -> dict[str, str]:
    """Model -> why it is left out, from the problems that leave services out (:class:`LeftOut`)."""
    return {p.model: str(p) for p in problems if isinstance(p, LeftOut)}


def config_models(config: ClusterConfig) -> list[ModelEntry]:
    """The cluster file's ``models:`` as ``models/`` entries."""
    return [
        ModelEntry(
            name=n,
            source=m.source or "",
            dtype=m.dtype,
            sim_model=m.sim_model,
            base=m.base,
            adapter=m.adapter,
        )
        for n, m in sorted(config.models.items())
    ]


def runtime_config(
    base: ClusterConfig, services: Mapping[str, ServiceSpec], models: Mapping[str, ModelEntry]
) -> tuple[ClusterConfig, list[str]]:
    """``base`` with its services replaced by etcd's ``services/`` and its models overlaid by etcd's
    ``models/`` (engines, placement and migration stay the file's). A service that cannot be served
    is left out and named in the returned problems: its model is declared nowhere, or (with a
    planner) has no cost-model catalog name, or shares one with another model."""
    problems: list[str] = []
    model_cfgs: dict[str, ModelConfig] = dict(base.models)
    for name, m in models.items():
        model_cfgs[name] = ModelConfig.model_construct(
            source=m.source or None, base=m.base, adapter=m.adapter, dtype=m.dtype, sim_model=m.sim_model
        )
    svc_cfgs: dict[str, ServiceSpec] = {}
    for name, spec in sorted(services.items()):
        if spec.model not in model_cfgs:
            why = f"service {name!r}: model {spec.model!r} is not declared (models/ or the config)"
            problems.append(LeftOut(why, name, spec.model))
            continue
        svc_cfgs[name] = spec
    if base.placement.planned:
        catalog: dict[str, str] = {}

        def host(model: str) -> str:  # an adapter is placed as its base (it follows its traffic there)
            return model_cfgs[model].base or model

        for model in sorted({host(s.model) for s in svc_cfgs.values()}):
            entry = model_cfgs.get(model)
            if entry is None:
                for name in [n for n, s in svc_cfgs.items() if host(s.model) == model]:
                    why = f"service {name!r}: base model {model!r} is not declared (models/ or the config)"
                    problems.append(LeftOut(why, name, svc_cfgs[name].model))
                    del svc_cfgs[name]
                continue
            try:
                cat = entry.sim_model if entry.sim_model is not None else model_arch(model).name
            except UnknownModel:
                cat = None
                why = f"model {model!r} is not a cost-model catalog name; declare it with a sim_model"
            else:
                if cat in catalog.values():
                    other = next(k for k, v in catalog.items() if v == cat)
                    why = f"models {other!r} and {model!r} both map to catalog model {cat!r}"
                    cat = None
            if cat is None:
                for name in [n for n, s in svc_cfgs.items() if host(s.model) == model]:
                    problems.append(LeftOut(f"service {name!r}: {why}", name, model))
                    del svc_cfgs[name]
            else:
                catalog[model] = cat
    return base.model_copy(update={"services": svc_cfgs, "models": model_cfgs}), problems


async def read_runtime_config(
    etcd: EtcdClient, base: ClusterConfig
) -> tuple[ClusterConfig, list[str]] | None:
    """:func:`runtime_config` over what etcd holds now (None: ``services/`` not seeded yet, so there
    is nothing to plan for). Read directly, not from a view, so a plan never lags the seeding."""
    keys = etcd.keys
    if await etcd.get(keys.services_seeded) is None:
        return None
    (raw_s, _), (raw_m, _) = await asyncio.gather(
        etcd.get_prefix(keys.services), etcd.get_prefix(keys.models)
    )
    problems: list[str] = []
    services: dict[str, ServiceSpec] = {}
    models: dict[str, ModelEntry] = {}
    for key, raw in raw_s.items():
        try:
            services[keys.leaf(key)] = ServiceSpec.from_json(raw)
        except (ValueError, TypeError, KeyError) as e:
            problems.append(f"undecodable {key}: {e}")
    for key, raw in raw_m.items():
        try:
            models[keys.leaf(key)] = ModelEntry.from_json(raw)
        except (ValueError, TypeError, KeyError) as e:
            problems.append(f"undecodable {key}: {e}")
    config, more = runtime_config(base, services, models)
    return config, problems + more


@dataclass
class PlacementController:
    config: ClusterConfig
    etcd: EtcdClient
    placement_view: PrefixView[DesiredPlacement]
    services_view: PrefixView[ServiceSpec]
    nodes_view: PrefixView[NodeRecord]
    resync_s: float = 5.0
    manage_placement: bool = True  # False: services/ only (a planner owns placement/)
    reseed: bool = False  # replace services/ and models/ with the config's (once per controller)
    config_path: str = ""  # for the seed record
    leader_id: str = ""
    election: LeaderElection | None = None  # fences the seeding with our leader lease
    policy: StaticConfigPlacement = field(init=False)
    seeded: bool = False  # this controller has seeded, or found etcd seeded
    _unplaced_logged: frozenset[str] = frozenset()
    _unplaced: UnplacedPublisher | None = None

    def __post_init__(self) -> None:
        self.policy = StaticConfigPlacement(tuple(self.config.placements()))

    async def seed(self) -> int:
        """Seed ``services/`` and ``models/`` once (module docstring); the number of keys written."""
        if self.seeded:
            return 0
        keys = self.etcd.keys
        guard = None
        if self.election is not None:
            if not self.election.is_leader or self.election.lease_id is None:
                return 0
            guard = (self.election.key, self.election.lease_id)
        services, models = self.config.service_specs(), config_models(self.config)
        seed = None if self.reseed else await get_seed(self.etcd)
        if seed is not None:
            self.seeded = True
            await self._note_drift(services)
            return 0
        if not self.reseed:  # only what etcd lacks (a cluster seeded before the marker existed)
            have_s, _ = await self.etcd.get_prefix(keys.services)
            have_m, _ = await self.etcd.get_prefix(keys.models)
            services = [s for s in services if keys.service(s.name) not in have_s]
            models = [m for m in models if keys.model(m.name) not in have_m]
        record = SeedRecord(
            leader=self.leader_id,
            config=self.config_path,
            time=time.time(),
            services=tuple(s.name for s in services),
            models=tuple(m.name for m in models),
            reseed=self.reseed,
        )
        if not await seed_desired(self.etcd, services, models, record, reseed=self.reseed, leader=guard):
            log.info("placement: services seeding raced another writer; reading again")
            return 0
        self.seeded = True
        log.info(
            "placement: %s services/ from %s: services %s, models %s",
            "reseeded" if self.reseed else "seeded",
            self.config_path or "the config",
            ", ".join(record.services) or "-",
            ", ".join(record.models) or "-",
        )
        return len(services) + len(models) + 1

    async def _note_drift(self, services: list[ServiceSpec]) -> None:
        """Log (once) where the file's services differ from etcd's: etcd wins after seeding."""
        have = self.services_view.snapshot() if self.services_view.ready.is_set() else {}
        differ = sorted(s.name for s in services if have.get(s.name) != s)
        if differ:
            log.warning(
                "placement: services %s differ from the cluster file or were deleted at runtime; etcd's "
                "services/ is the truth once seeded (llmfleet apply -f %s, or --reseed, to use the file)",
                ", ".join(differ),
                self.config_path or "<config>",
            )

    def _note_unplaced(self, placements: Mapping[str, DesiredPlacement]) -> dict[str, str]:
        """Log (once) the services the static plan leaves unplaced; their models -> why."""
        hosted = {m.name for p in placements.values() for m in p.models}
        unplaced = frozenset(n for n, s in self.services_view.snapshot().items() if s.model not in hosted)
        for name in sorted(unplaced - self._unplaced_logged):
            spec = self.services_view.snapshot()[name]
            log.warning(
                "placement: service %r is unplaced: the static policy puts model %r on no engine "
                "(list it under an engine's models: in the cluster file, or use a planner policy)",
                name,
                spec.model,
            )
        self._unplaced_logged = unplaced
        specs = self.services_view.snapshot()
        return {
            specs[n].model: f"the static placement lists model {specs[n].model!r} on no engine"
            for n in sorted(unplaced)
        }

    async def _publish_unplaced(self, models: dict[str, str]) -> None:
        """Tell the schedulers which models will not be placed (``coord.unplaced``), when it changes."""
        if self._unplaced is None:
            self._unplaced = UnplacedPublisher(self.etcd, self.election)
        await self._unplaced.publish(models)

    async def reconcile_once(self) -> int:
        """Seed once, then write what differs between the static plan and etcd; returns the number of
        keys changed. Never writes services/ after the seeding."""
        changed = await self.seed()
        if not self.manage_placement:
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
        if self.services_view.ready.is_set():
            await self._publish_unplaced(self._note_unplaced(self.placement_view.snapshot()))
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
