"""Completed requests reported to the profiler in batches: ONE ``Observe`` call per ``window_s``.

One unary call per request cost the scheduler about 0.15 ms and the profiler about 0.35 ms of CPU
(on the 2-core test machine), on the same cores that serve the next requests' first tokens; a batch
per window costs that once. With tracing on, each request's observation is sent on its own (no
window) so its ``Observe`` span stays in that request's trace. A profiler that is down or slow costs
nothing but the observations (logged at debug level).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc
from llmfleet.api.v1 import profiler_pb2, profiler_pb2_grpc
from llmfleet.telemetry import tracing_enabled

from llmfleet_scheduler.directory import ClusterDirectory

log = logging.getLogger(__name__)


@dataclass
class ObservationBatcher:
    directory: ClusterDirectory
    window_s: float = 0.05
    max_items: int = 512  # the profiler takes up to 4,096 per call
    timeout_s: float = 1.0
    calls: int = 0
    failures: int = 0
    _pending: list[profiler_pb2.Observation] = field(default_factory=list)
    _flusher: asyncio.Task | None = None
    _tasks: set[asyncio.Task] = field(default_factory=set)

    def add(self, obs: profiler_pb2.Observation) -> None:
        """Queue one observation; it is sent within ``window_s`` (at once when tracing is on)."""
        if tracing_enabled():  # created in the request's context: the span joins its trace
            self._spawn(self._send([obs]))
            return
        self._pending.append(obs)
        if len(self._pending) >= self.max_items:
            batch, self._pending = self._pending, []
            self._spawn(self._send(batch))
        elif self._flusher is None or self._flusher.done():
            self._flusher = self._spawn(self._flush_later())

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.window_s)
        batch, self._pending = self._pending, []
        if batch:
            await self._send(batch)

    async def _send(self, batch: list[profiler_pb2.Observation]) -> None:
        prof = self.directory.first_of_role("profiler")
        if prof is None:
            return
        stub = profiler_pb2_grpc.ProfilerStub(self.directory.channel(prof.address))
        self.calls += 1
        try:
            await stub.Observe(profiler_pb2.ObserveRequest(items=batch), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            self.failures += 1
            log.debug("profiler Observe of %d requests failed: %s", len(batch), e.code())

    async def close(self) -> None:
        """Send what is pending (best effort) and stop."""
        if self._flusher is not None:
            self._flusher.cancel()
        batch, self._pending = self._pending, []
        if batch:
            await self._send(batch)
        for t in list(self._tasks):
            t.cancel()
