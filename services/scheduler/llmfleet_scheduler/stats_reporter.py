"""The scheduler's side of the service monitor: every request's arrival and end go into a local
:class:`~llmfleet.monitor.ServiceMonitor`; every ``interval_s`` its per-service statistics (and the
recent request samples) are streamed to the placement leader (``Placement.ReportStats``).

Recording is a few list appends on the request path; nothing waits on the leader. A report is the
monitor's whole current state, so nothing is buffered: while the leader is down or changing, reports
are simply not made, and the next one after reconnecting carries the full windows. The leader is
found like every client finds it: its id under ``leaders/placement`` in etcd (or named in an ack by
the replica we reached), its address in ``nodes/``. Broken streams reconnect with exponential
backoff (0.2 s doubling to ``backoff_max_s``, reset by an acknowledged report).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import grpc
from llmfleet.api.v1 import placement_pb2, placement_pb2_grpc
from llmfleet.coord import EtcdClient
from llmfleet.monitor import Completion, ServiceMonitor
from llmfleet.monitor.wire import stats_to_proto

from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.journal import RequestRecord
from llmfleet_scheduler.relay import COMPLETED

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.2
LEADER_ROLE = "placement"


@dataclass
class StatsReporter:
    scheduler_id: str
    directory: ClusterDirectory
    interval_s: float = 2.0
    monitor: ServiceMonitor = field(default_factory=lambda: ServiceMonitor(start_s=time.monotonic()))
    timeout_s: float = 2.0  # per write and per ack
    backoff_max_s: float = 5.0
    etcd: EtcdClient | None = None  # set once etcd is reached (finds the leader)
    target: str = ""  # the placement replica reports go to now ("" when none)
    reports_sent: int = 0  # acknowledged reports
    reports_refused: int = 0
    connects: int = 0
    # per service, right now: (requests not started, of them held here, of those waiting for a model
    # no engine hosts); sent with every report so the leader counts queues as demand
    backlog: Callable[[], dict[str, tuple[int, int, int]]] | None = None
    _seq: itertools.count = field(default_factory=lambda: itertools.count(1))
    _backoff: float = BACKOFF_START_S
    _kick: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"the stats interval must be > 0 s, got {self.interval_s}")

    # -- recording (called by the relay; never raises) -----------------------------------------------------
    def arrived(self, rec: RequestRecord) -> None:
        try:
            self.monitor.arrive(rec.service, rec.model, rec.arrival)
        except Exception:  # statistics must never fail a request
            log.exception("stats: recording the arrival of %s failed", rec.request_id)

    def infeasible(self, rec: RequestRecord) -> None:
        self.monitor.count_infeasible(rec.service)

    def finished(self, rec: RequestRecord) -> None:
        """A request ended: completed (finish reason length/stop/eos) or failed; cancelled ones (the
        client left or cancelled) are not the service's outcome and are not recorded."""
        try:
            if rec.error is not None:
                ok = False
            elif rec.final is not None and rec.final.finish_reason in COMPLETED:
                ok = True
            else:
                return
            finish = rec.finished_at or time.monotonic()
            c = Completion.timed(
                rec.service, rec.model, rec.arrival, rec.first_token_at, finish, rec.prompt_tokens,
                rec.n_tokens, ok,
            )  # fmt: skip
            self.monitor.complete(c)
        except Exception:
            log.exception("stats: recording the end of %s failed", rec.request_id)

    def kick(self, service: str = "") -> None:
        """Report now rather than at the next interval (a request waits for an unhosted model)."""
        self._kick.set()

    # -- reporting -------------------------------------------------------------------------------------------
    def report(self, now: float) -> placement_pb2.ServiceStatsReport:
        """The monitor's state at ``now`` (every known service, with or without traffic), with each
        service's current backlog."""
        slos = {name: spec.slo for name, spec in self.directory.services().items()}
        stats = self.monitor.stats(now, slos)
        if self.backlog is not None:
            queued = self.backlog()
            stats = [
                replace(s, queued=queued[s.service][0], held=queued[s.service][1], cold=queued[s.service][2])
                if s.service in queued
                else s
                for s in stats
            ]
        return placement_pb2.ServiceStatsReport(
            scheduler_id=self.scheduler_id,
            seq=next(self._seq),
            interval_s=self.interval_s,
            services=[stats_to_proto(s, now) for s in stats],
        )

    async def run(self) -> None:
        """Stream reports to the placement leader forever (reconnecting; never raises)."""
        hint = ""
        while True:
            try:
                target = await self._resolve(hint)
                if target is None:
                    raise LookupError("no placement leader known yet")
                self.target = target[0]
                self.connects += 1
                hint = await self._stream(*target)
                log.info("stats: %s is not the placement leader; switching to %s", self.target, hint)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                hint, self.target = "", ""
                log.log(
                    logging.INFO if self._backoff == BACKOFF_START_S else logging.DEBUG,
                    "stats: cannot report to the placement leader (retrying in %.1fs): %s",
                    self._backoff,
                    _describe(e),
                )
                await asyncio.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, self.backoff_max_s)

    async def _resolve(self, hint: str) -> tuple[str, str] | None:
        """(leader id, address): ``hint`` or the election key's holder, if it is a live node."""
        leader = hint
        if not leader:
            if self.etcd is None:
                return None
            raw = await self.etcd.get(self.etcd.keys.leader(LEADER_ROLE), timeout=self.timeout_s)
            leader = raw.decode() if raw else ""
        node = self.directory.nodes().get(leader) if leader else None
        return (leader, node.address) if node is not None else None

    async def _stream(self, node_id: str, address: str) -> str:
        """Report to ``address`` every interval until its ack names another leader (returned); any
        stream error raises. A replica that is not leader and knows none keeps the reports."""
        stub = placement_pb2_grpc.PlacementStub(self.directory.channel(address))
        call = stub.ReportStats()
        try:
            while True:
                msg = self.report(time.monotonic())
                await asyncio.wait_for(call.write(msg), self.timeout_s)
                ack = await asyncio.wait_for(call.read(), self.timeout_s)
                if ack is grpc.aio.EOF:
                    raise ConnectionError(f"{node_id} closed the stats stream")
                self._backoff = BACKOFF_START_S
                if ack.accepted:
                    self.reports_sent += 1
                else:
                    self.reports_refused += 1
                    log.warning("stats: %s refused report %d: %s", node_id, ack.seq, ack.error)
                if not ack.is_leader and ack.leader_id and ack.leader_id != node_id:
                    return ack.leader_id
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), self.interval_s)
                self._kick.clear()
        finally:
            call.cancel()


def _describe(e: Exception) -> str:
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return str(e) or type(e).__name__
