"""What the front reads from etcd, as the scheduler reads it: ``services/`` (the model ids),
``models/`` (each model's source, for its chat template), ``nodes/`` (the scheduler replicas to send
requests to, and the engines that make a service servable)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmfleet.coord import EtcdClient
from llmfleet.coord.desired import ModelEntry, model_view, node_view, service_view
from llmfleet.coord.view import PrefixView
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import NodeRecord
from llmfleet_scheduler.readiness import unserved

SCHEDULER_ROLE = "scheduler"  # the role schedulers register under in nodes/
ENGINE_ROLE = "engine"


@dataclass
class ClusterView:
    """``schedulers``: fixed replica addresses (``--scheduler``); empty: the schedulers registered in
    etcd's ``nodes/``, in id order. The views exist once :meth:`attach` ran (etcd reached)."""

    schedulers: Sequence[str] = ()
    services_view: PrefixView[ServiceSpec] | None = None
    models_view: PrefixView[ModelEntry] | None = None
    nodes_view: PrefixView[NodeRecord] | None = None

    async def attach(self, etcd: EtcdClient) -> None:
        """Start following etcd (the front's ``on_etcd`` hook)."""
        self.services_view = service_view(etcd)
        self.models_view = model_view(etcd)
        self.nodes_view = node_view(etcd)
        for view in (self.services_view, self.models_view, self.nodes_view):
            await view.start()

    async def close(self) -> None:
        for view in (self.services_view, self.models_view, self.nodes_view):
            if view is not None:
                await view.stop()

    def ready(self) -> bool:
        return self.services_view is not None and self.services_view.ready.is_set()

    def services(self) -> dict[str, ServiceSpec]:
        return self.services_view.snapshot() if self.services_view is not None else {}

    def nodes(self) -> list[NodeRecord]:
        return list(self.nodes_view.snapshot().values()) if self.nodes_view is not None else []

    def scheduler_addresses(self) -> list[str]:
        if self.schedulers:
            return list(self.schedulers)
        return [n.address for n in sorted(self.nodes(), key=lambda n: n.node_id) if n.role == SCHEDULER_ROLE]

    def servable(self) -> tuple[bool, list[str]]:
        """Whether every service that must be served has an engine and a scheduler is known (else
        what is missing), as the scheduler's readiness says it."""
        if not self.ready():
            return False, ["(not connected to etcd yet)"]
        if not self.scheduler_addresses():
            return False, ["(no scheduler registered)"]
        missing = unserved(self.services(), [n for n in self.nodes() if n.role == ENGINE_ROLE])
        return not missing, missing

    def model_source(self, model: str) -> str | None:
        entry = self.models_view.snapshot().get(model) if self.models_view is not None else None
        return entry.source if entry is not None else None
