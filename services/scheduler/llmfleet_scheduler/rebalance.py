"""Aladdin's Algorithm 2 live: every epoch each dispatch policy that is a
:class:`~llmfleet.policies.dispatch.Rebalancer` plans moves of requests that have not started (no
token yet), and the scheduler carries each out with the source engine's ``Migrate`` in token mode (a
queued request holds no KV: its prompt travels and the destination prefills it). The relay follows the
request to the destination as for any migration and records the move with the policy's
``apply_move`` instead of an end (``Relay.planned_moves``). A request that produced a token meanwhile
is skipped (Aladdin never moves a started request); one that starts while the move is under way is
moved anyway and reported to the policy as an end at the source (the ledger cannot take it as a move).

:class:`QueuedMoves` does the same for any dispatch policy (``--move-queued``, the alternative to
late binding): requests queued past an engine's room move to engines with room
(``llmfleet.policies.capacity.queue_moves``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc
from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
from llmfleet.policies.capacity import Saturation, plan_queue_moves
from llmfleet.policies.dispatch import Rebalancer

from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.journal import RequestRecord
from llmfleet_scheduler.relay import Relay
from llmfleet_scheduler.routing import DispatchRouter

log = logging.getLogger(__name__)


@dataclass
class RebalanceStats:
    epochs: int = 0
    planned: int = 0
    moved: int = 0
    skipped: int = 0  # started, gone, or an engine unknown here
    failed: int = 0  # the engine refused or the transfer failed (the request stays at its source)


@dataclass
class QueuedMoves:
    """Moves of not-started requests off engines past their room, for any dispatch policy: the
    requests this scheduler dispatched that have no token yet, per engine, in arrival order."""

    directory: ClusterDirectory
    live: Callable[[], Iterable[RequestRecord]]  # the journal's live records
    saturation: Saturation = field(default_factory=Saturation)

    def plan(self) -> list[tuple[str, str, str]]:
        queued: dict[str, list[tuple[float, str, str]]] = {}
        for rec in self.live():
            if rec.first_token_at is None and not rec.done and rec.engines:
                queued.setdefault(rec.engines[-1], []).append((rec.arrival, rec.request_id, rec.model))
        if not queued:
            return []
        ordered = {e: [(rid, m) for _, rid, m in sorted(rs)] for e, rs in queued.items()}
        cands = self.directory.candidates()
        occupancy = {c.engine_id: self.directory.load.occupancy(c.engine_id) for c in cands}
        return plan_queue_moves(cands, ordered, self.saturation, occupancy=occupancy)


@dataclass
class LiveRebalance:
    router: DispatchRouter
    relay: Relay
    directory: ClusterDirectory
    started: Callable[[str], bool]  # request id -> produced a token already (or unknown here)
    epoch_s: float = 1.0
    timeout_s: float = 10.0
    stats: RebalanceStats = field(default_factory=RebalanceStats)
    queued: QueuedMoves | None = None  # also move queued requests for any dispatch policy

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.epoch_s)
            try:
                await self.tick()
            except Exception:  # a bad epoch must not stop the loop
                log.exception("rebalance epoch failed")

    async def tick(self) -> int:
        """One epoch over every rebalancing policy; returns the number of requests moved."""
        self.stats.epochs += 1
        moves = []
        for policy in self.router.policies():
            if isinstance(policy, Rebalancer):
                moves += policy.rebalance(time.monotonic())
        if self.queued is not None:
            moves += self.queued.plan()
        self.stats.planned += len(moves)
        done = await asyncio.gather(*(self._move(*m) for m in moves))
        return sum(done)

    async def _move(self, request_id: str, src: str, dst: str) -> bool:
        engines = self.directory.engines()
        if self.started(request_id) or src not in engines or dst not in engines:
            self.stats.skipped += 1
            return False
        self.relay.planned_moves[request_id] = dst
        stub = engine_pb2_grpc.EngineStub(self.directory.channel(engines[src].address))
        req = engine_pb2.MigrateRequest(
            request_id=request_id, destination=engines[dst].address, mode=engine_pb2.MIGRATE_MODE_TOKENS
        )
        try:
            await stub.Migrate(req, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            self.relay.planned_moves.pop(request_id, None)
            if e.code() == grpc.StatusCode.NOT_FOUND:  # finished or gone meanwhile
                self.stats.skipped += 1
            else:
                self.stats.failed += 1
                log.warning("rebalance: moving %s %s -> %s failed: %s", request_id, src, dst, e.details())
            return False
        self.stats.moved += 1
        log.info("rebalance: moved %s from %s to %s (not started)", request_id, src, dst)
        return True
