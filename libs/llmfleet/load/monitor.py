"""Keeps one WatchLoad stream open per live engine and remembers each engine's latest snapshot.

Engines come and go with the etcd node view: a stream is opened for every engine that appears and
closed for every engine whose node key disappears (or that re-registers at another address); a broken
stream is reopened with exponential backoff (0.2 s doubling to 5 s, reset by the next snapshot).
Used by the migration service (``Status``) and the scheduler (dispatch candidates): listeners
(:class:`LoadListener`, e.g. :class:`~llmfleet.load.book.LoadBook`) hear every snapshot, as a plain
:class:`~llmfleet.load.book.LoadReport`, and every engine that leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.coord import PrefixView
from llmfleet.load.book import LoadReport
from llmfleet.policies.dispatch.base import AdapterPoolView
from llmfleet.rpc.channels import open_channel
from llmfleet.types import ENGINE_ROLE, NodeRecord

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0


class LoadListener(Protocol):
    def report(self, engine_id: str, report: LoadReport) -> None: ...

    def forget(self, engine_id: str) -> None: ...


def report_from_proto(snap: common_pb2.LoadSnapshot) -> LoadReport:
    """The plain-data view of a snapshot; KV bytes per token per model from its tokens and bytes;
    the queued requests' prompt KV from the per-request loads (at the models' bytes per token); the
    prefix cache's bytes from its blocks, when the engine counts its pool in blocks (vLLM engines
    count theirs from vLLM's KV-cache events, and report no size when they cannot); an adapter pool per model with LoRA on (slots, resident adapters)."""
    bpt = {m.model: m.kv_used_bytes / m.kv_tokens for m in snap.models if m.kv_tokens}
    waiting = sum(r.tokens * bpt.get(r.model, 0.0) for r in snap.requests if r.phase == "waiting")
    cached = None
    if snap.HasField("prefix_cache") and snap.kv_blocks_total:
        cached = snap.prefix_cache.blocks * snap.kv_capacity_bytes // snap.kv_blocks_total
    return LoadReport(
        running=snap.running,
        waiting=snap.waiting,
        kv_used_bytes=snap.kv_used_bytes,
        kv_capacity_bytes=snap.kv_capacity_bytes,
        kv_bytes_per_token=bpt,
        kv_waiting_bytes=int(waiting),
        max_running=snap.max_running,
        request_ids=frozenset(r.request_id for r in snap.requests),
        prefix_cached_bytes=cached,
        adapter_pools=tuple(
            AdapterPoolView(m.model, tuple(m.adapters), m.adapter_slots)
            for m in snap.models
            if m.adapter_slots or m.adapters
        ),
    )


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
    listeners: list[LoadListener] = field(default_factory=list)
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
                for listener in self.listeners:
                    listener.forget(eid)
        for eid, node in live.items():
            if eid not in self._streams:
                self.engines[eid] = EngineLoadState(eid, node.address)
                self._streams[eid] = asyncio.create_task(self._follow(self.engines[eid]), name=f"load-{eid}")

    def _received(self, state: EngineLoadState, snap: common_pb2.LoadSnapshot) -> None:
        state.snapshot, state.received_at, state.reporting = snap, time.monotonic(), True
        if self.listeners:
            report = report_from_proto(snap)
            for listener in self.listeners:
                listener.report(state.engine_id, report)

    async def _follow(self, state: EngineLoadState) -> None:
        backoff = BACKOFF_START_S
        async with open_channel(state.address) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            while True:
                try:
                    async for snap in stub.WatchLoad(engine_pb2.WatchLoadRequest(interval_s=self.interval_s)):
                        self._received(state, snap)
                        backoff = BACKOFF_START_S
                except grpc.aio.AioRpcError as e:
                    log.debug("load stream from %s broke: %s", state.engine_id, e.code())
                state.reporting = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def close(self) -> None:
        for t in self._streams.values():
            t.cancel()
        for t in self._streams.values():
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._streams.clear()
