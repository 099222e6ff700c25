"""Keeps one WatchLoad stream open per live engine and remembers each engine's latest snapshot.

Engines come and go with the etcd node view: a stream is opened for every engine that appears and
closed for every engine whose node key disappears; a broken stream is reopened with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import grpc
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.coord import PrefixView
from llmfleet.rpc.channels import open_channel
from llmfleet.types import ENGINE_ROLE, NodeRecord

log = logging.getLogger(__name__)


@dataclass
class EngineLoadState:
    engine_id: str
    address: str
    snapshot: common_pb2.LoadSnapshot | None = None
    received_at: float | None = None  # monotonic
    reporting: bool = False


@dataclass
class LoadMonitor:
    interval_s: float = 1.0
    engines: dict[str, EngineLoadState] = field(default_factory=dict)
    _streams: dict[str, asyncio.Task] = field(default_factory=dict)

    async def track(self, nodes_view: PrefixView[NodeRecord]) -> None:
        """Follow the node view forever, opening/closing streams as engines join and leave."""
        async for _, nodes in nodes_view.subscribe():
            self.reconcile(nodes)

    def reconcile(self, nodes: dict[str, NodeRecord]) -> None:
        live = {n.node_id: n for n in nodes.values() if n.role == ENGINE_ROLE}
        for eid in list(self._streams):
            if eid not in live or live[eid].address != self.engines[eid].address:
                self._streams.pop(eid).cancel()
                self.engines.pop(eid, None)
        for eid, node in live.items():
            if eid not in self._streams:
                self.engines[eid] = EngineLoadState(eid, node.address)
                self._streams[eid] = asyncio.create_task(self._follow(self.engines[eid]), name=f"load-{eid}")

    async def _follow(self, state: EngineLoadState) -> None:
        backoff = 0.2
        async with open_channel(state.address) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            while True:
                try:
                    async for snap in stub.WatchLoad(engine_pb2.WatchLoadRequest(interval_s=self.interval_s)):
                        state.snapshot, state.received_at, state.reporting = snap, time.monotonic(), True
                        backoff = 0.2
                except grpc.aio.AioRpcError as e:
                    log.debug("load stream from %s broke: %s", state.engine_id, e.code())
                state.reporting = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def close(self) -> None:
        for t in self._streams.values():
            t.cancel()
        for t in self._streams.values():
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._streams.clear()
