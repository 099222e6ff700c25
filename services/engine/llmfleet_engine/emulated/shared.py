"""What the engines of one process share: one etcd client (each engine keeps its own lease and node
record) and one watch per prefix (placement, nodes, the model catalog) instead of one per engine."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from llmfleet.config import EtcdSettings
from llmfleet.coord import EtcdClient, node_view, placement_view
from llmfleet.coord.desired import ModelEntry, model_view
from llmfleet.coord.view import PrefixView
from llmfleet.types import DesiredPlacement, NodeRecord


@dataclass
class SharedEtcd:
    settings: EtcdSettings
    client: EtcdClient = field(init=False)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _views: tuple[PrefixView[DesiredPlacement], PrefixView[NodeRecord]] | None = None
    _catalog: PrefixView[ModelEntry] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _connect: asyncio.Task | None = None

    def __post_init__(self) -> None:
        self.client = EtcdClient(self.settings)

    def start(self) -> None:
        """Connect in the background (retrying forever, as every service does); ``ready`` when done."""

        async def connect() -> None:
            await self.client.connect(wait=True)
            self.ready.set()

        self._connect = asyncio.create_task(connect(), name="shared-etcd-connect")

    async def views(self) -> tuple[PrefixView[DesiredPlacement], PrefixView[NodeRecord]]:
        """The placement and node views, started by the first engine that asks."""
        async with self._lock:
            if self._views is None:
                placements, nodes = placement_view(self.client), node_view(self.client)
                await placements.start()
                await nodes.start()
                self._views = (placements, nodes)
            return self._views

    async def catalog(self) -> PrefixView[ModelEntry]:
        """The model catalog's view (its adapter entries are what LoRA engines follow), started by the
        first engine that asks."""
        async with self._lock:
            if self._catalog is None:
                catalog = model_view(self.client)
                await catalog.start()
                self._catalog = catalog
            return self._catalog

    async def stop(self) -> None:
        if self._connect is not None:
            self._connect.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._connect
        views: list[PrefixView] = [*(self._views or ()), *([self._catalog] if self._catalog else [])]
        for v in views:
            with contextlib.suppress(Exception):
                await v.stop()
        with contextlib.suppress(Exception):
            await self.client.close()
