"""The scheduler's read-only picture of the cluster: services and live nodes from etcd views, plus each
engine's load for the dispatch policies.

Load path: every engine streams ``WatchLoad`` snapshots; the shared
:class:`~llmfleet.load.monitor.LoadMonitor` (one stream per engine in the nodes view) feeds them to a
:class:`~llmfleet.load.book.LoadBook`, to which the relay adds every request it sends and releases
every placement that ends; :meth:`ClusterDirectory.candidates` is the book's view: the last snapshot
plus the requests dispatched since (see ``llmfleet.load.book`` for when a snapshot covers them).
Without the monitor (``--no-load-monitor``) the book holds only this scheduler's own outstanding
requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import grpc
from llmfleet.coord.desired import ModelEntry
from llmfleet.load import LoadBook
from llmfleet.load.monitor import LoadMonitor
from llmfleet.policies.dispatch import EngineCandidate
from llmfleet.rpc.channels import open_channel
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import ENGINE_ROLE, NodeRecord

T = TypeVar("T")


class DirectoryView(Protocol[T]):
    """What the scheduler reads of a ``llmfleet.coord.PrefixView``: whether it is ready, its map (key
    leaf -> value), its changes, and stop (``llmfleet.testing.StaticView`` fits too)."""

    @property
    def ready(self) -> asyncio.Event: ...

    def snapshot(self) -> dict[str, T]: ...

    def subscribe(self) -> AsyncIterator[tuple[int, dict[str, T]]]: ...

    async def stop(self) -> None: ...


@dataclass
class ClusterDirectory:
    services_view: DirectoryView[ServiceSpec] | None = None
    nodes_view: DirectoryView[NodeRecord] | None = None
    models_view: DirectoryView[ModelEntry] | None = None  # model sources (chat templates)
    # the models the placement leader will not place, and why (llmfleet.coord.unplaced)
    unplaced_view: DirectoryView[dict[str, str]] | None = None
    load: LoadBook = field(default_factory=LoadBook)
    monitor: LoadMonitor | None = None  # None: no load source (the book sees only what we dispatch)
    _channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return all(v is not None and v.ready.is_set() for v in (self.services_view, self.nodes_view))

    def services(self) -> dict[str, ServiceSpec]:
        return self.services_view.snapshot() if self.services_view is not None else {}

    def model_source(self, model: str) -> str | None:
        entry = self.models_view.snapshot().get(model) if self.models_view is not None else None
        return entry.source if entry is not None else None

    def sim_model(self, model: str) -> str | None:
        """The cost-model catalog name ``models/`` gives ``model`` (None: none given)."""
        entry = self.models_view.snapshot().get(model) if self.models_view is not None else None
        return entry.sim_model if entry is not None else None

    def base_of(self, model: str) -> str:
        """The base model of ``model`` when the catalog (``models/``) says it is a LoRA adapter, else ""."""
        entry = self.models_view.snapshot().get(model) if self.models_view is not None else None
        return (entry.base or "") if entry is not None else ""

    def unplaced(self, model: str) -> str | None:
        """Why the placement leader will not place ``model`` (None: it may)."""
        if self.unplaced_view is None:
            return None
        return self.unplaced_view.snapshot().get("", {}).get(model)

    def nodes(self) -> dict[str, NodeRecord]:
        return self.nodes_view.snapshot() if self.nodes_view is not None else {}

    def engines(self) -> dict[str, NodeRecord]:
        return {k: n for k, n in self.nodes().items() if n.role == ENGINE_ROLE}

    def candidates(self, progress: bool = False) -> list[EngineCandidate]:
        """Every live engine with its load: last snapshot + requests dispatched since (``self.load``);
        ``progress``: with the measured progress of the requests this scheduler relays from it."""
        load = self.load
        return [
            load.candidate(n.node_id, n.models, n.kv_capacity_bytes, with_progress=progress)
            for n in self.engines().values()
        ]

    def engine_at(self, address: str) -> str | None:
        """Id of the engine registered at ``address``, if any."""
        return next((n.node_id for n in self.engines().values() if n.address == address), None)

    def first_of_role(self, role: str) -> NodeRecord | None:
        nodes = sorted((n for n in self.nodes().values() if n.role == role), key=lambda n: n.node_id)
        return nodes[0] if nodes else None

    def channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_channel(address)
        return ch

    async def close(self) -> None:
        if self.monitor is not None:
            await self.monitor.close()
        for v in (self.services_view, self.nodes_view, self.models_view, self.unplaced_view):
            if v is not None:
                await v.stop()
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
