"""Placement servicer against a real etcd: ReportStats feeds the fleet monitor (one ack per report, a
bad report refused in its ack), GetPlan returns the engine pool, GPUs in use, decisions and the merged
monitor; the scheduler's StatsReporter finds the leader, streams to it and follows a leader change."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from llmfleet.api.v1 import common_pb2, placement_pb2, placement_pb2_grpc
from llmfleet.coord import EtcdClient, LeaderElection, node_view, placement_view, put_placement
from llmfleet.monitor import Completion, Decision, ServiceMonitor
from llmfleet.monitor.wire import stats_to_proto
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.spec.services import ServiceSpec
from llmfleet.testing import StaticView, eventually
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, ModelSpec, NodeRecord, Slo
from llmfleet_placement.servicer import PlacementServicer
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.journal import RequestRecord
from llmfleet_scheduler.stats_reporter import StatsReporter

SLO = Slo(ttft_s=1.0, tpot_s=0.1)
LLAMA = ModelSpec("llama", "tiny://llama")


class Replica:
    """One placement replica in-process: servicer + gRPC server + election (campaigning or not)."""

    def __init__(self, etcd: EtcdClient, node_id: str) -> None:
        self.etcd, self.node_id = etcd, node_id
        self.servicer = PlacementServicer(node_id)
        self.server: GrpcServer | None = None

    async def start(self) -> Replica:
        s = self.servicer
        s.placement_view, s.nodes_view = placement_view(self.etcd), node_view(self.etcd)
        s.views = (s.placement_view, s.nodes_view)
        for v in s.views:
            await v.start()
        s.election = LeaderElection(self.etcd, "placement", self.node_id, 2)
        self.server = await GrpcServer(
            [
                (
                    placement_pb2_grpc.add_PlacementServicer_to_server,
                    s,
                    service_name(placement_pb2, "Placement"),
                )
            ]
        ).start()
        return self

    @property
    def address(self) -> str:
        assert self.server is not None
        return self.server.address

    async def stop(self) -> None:
        await self.servicer.shutdown()
        if self.server is not None:
            await self.server.stop(0)


@pytest.fixture
async def leader(etcd_client: EtcdClient) -> AsyncIterator[Replica]:
    r = await Replica(etcd_client, "placement-0").start()
    await r.servicer.election.campaign()
    try:
        yield r
    finally:
        await r.stop()


def report(scheduler: str, now: float, n: int, seq: int = 1) -> placement_pb2.ServiceStatsReport:
    m = ServiceMonitor(start_s=0.0)
    for i in range(n):
        m.arrive("chat", "llama", i * 0.5)
        m.complete(Completion("chat", "llama", i * 0.5, 20, 8, 0.2, 0.05, 0.55))
    stats = m.stats(now, {"chat": SLO, "idle": SLO})
    return placement_pb2.ServiceStatsReport(
        scheduler_id=scheduler, seq=seq, interval_s=2.0, services=[stats_to_proto(s, now) for s in stats]
    )


async def test_report_stats_and_get_plan(etcd_client: EtcdClient, leader: Replica):
    nodes = [
        NodeRecord(
            "e0", ENGINE_ROLE, "h:1", "cuda:0", 80 << 30, models=("llama",), hardware="a100-80gb", tp=2
        ),
        NodeRecord("e1", ENGINE_ROLE, "h:2", "cuda:0", 80 << 30, hardware="a100-80gb", tp=2),
        NodeRecord("e2", ENGINE_ROLE, "h:3", "cpu", hardware="cpu"),
    ]
    for n in nodes:
        await etcd_client.put(etcd_client.keys.node(n.node_id), n.to_json())
    await put_placement(etcd_client, DesiredPlacement("e0", (LLAMA,)))
    await put_placement(etcd_client, DesiredPlacement("e1", (LLAMA,)))
    s = leader.servicer
    await eventually(
        lambda: len(s.nodes_view.snapshot()) == 3 and len(s.placement_view.snapshot()) == 2, 5, "views"
    )

    async with grpc.aio.insecure_channel(leader.address) as ch:
        stub = placement_pb2_grpc.PlacementStub(ch)
        call = stub.ReportStats()
        await call.write(report("sched-a", 30.0, 40))
        ack = await call.read()
        assert ack.accepted and ack.is_leader and ack.leader_id == "placement-0" and ack.seq == 1
        bad = report("sched-b", 30.0, 10, seq=7)
        bad.services[0].windows[0].completed = -1
        await call.write(bad)
        ack = await call.read()
        assert not ack.accepted and ">= 0" in ack.error and ack.seq == 7
        await call.write(report("sched-b", 30.0, 20, seq=8))  # the stream goes on after a refusal
        assert (await call.read()).accepted
        await call.write(placement_pb2.ServiceStatsReport(seq=9))
        ack = await call.read()
        assert not ack.accepted and "scheduler_id" in ack.error
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF

        s.decisions.append(Decision(time.time(), "seallm", "e1: + llama", "chat attainment 0.62 < 0.9"))
        s.decisions.append(Decision.failed(time.time(), "seallm", "llama-70b fits no engine group"))
        plan = await stub.GetPlan(placement_pb2.GetPlanRequest(), timeout=5)

    assert plan.is_leader and plan.leader_id == "placement-0"
    assert [(e.engine_id, e.tp, e.idle, e.hardware) for e in plan.pool] == [
        ("e0", 2, False, "a100-80gb"),
        ("e1", 2, False, "a100-80gb"),  # given llama, not loaded yet: in use
        ("e2", 1, True, "cpu"),
    ]
    assert (plan.gpus_in_use, plan.gpus_total) == (4, 5)
    assert [d.summary for d in plan.decisions] == ["e1: + llama", "kept the last good plan"]
    assert not plan.decisions[1].ok and "fits no engine" in plan.decisions[1].error
    svc = {x.service: x for x in plan.services}
    assert set(svc) == {"chat", "idle"} and not svc["chat"].samples  # GetPlan carries no samples
    assert svc["chat"].windows[-1].arrivals == 60  # sched-a 40 + sched-b 20
    assert [r.source for r in s.monitor.sources(time.monotonic())] == ["sched-a", "sched-b"]
    (chat, idle) = s.monitor.loads(time.monotonic(), {"chat": SLO, "idle": SLO}, window_s=300)
    assert chat.rate_rps == pytest.approx(40 / 30 + 20 / 30) and chat.attainment == 1.0
    assert chat.mean_prompt_tokens == 20 and idle.rate_rps == 0 and idle.attainment is None
    assert len(s.monitor.stats(time.monotonic())[0].samples) == 60


def finished(rid: str, service: str = "chat", tokens: int = 4) -> RequestRecord:
    now = time.monotonic()
    rec = RequestRecord(rid, service, "llama", b"", arrival=now - 1.0, n_tokens=tokens, prompt_tokens=12)
    rec.first_token_at, rec.finished_at = now - 0.8, now
    rec.final = common_pb2.TokenChunk(finish_reason=common_pb2.FINISH_REASON_LENGTH)
    return rec


async def test_reporter_finds_the_leader_and_follows_a_change(etcd_client: EtcdClient, leader: Replica):
    standby = await Replica(etcd_client, "placement-1").start()
    placement_nodes = {r.node_id: NodeRecord(r.node_id, "placement", r.address) for r in (leader, standby)}
    directory = ClusterDirectory(
        StaticView({"chat": ServiceSpec("chat", "llama", SLO)}), StaticView(placement_nodes)
    )
    reporter = StatsReporter("sched-x", directory, interval_s=0.1, backoff_max_s=0.5)
    for i in range(3):
        rec = finished(f"r{i}")
        reporter.arrived(rec)
        reporter.finished(rec)
    cancelled = finished("c")
    cancelled.final.finish_reason = common_pb2.FINISH_REASON_CANCELLED  # not an outcome of the service
    reporter.finished(cancelled)
    task = asyncio.create_task(reporter.run())
    try:
        await asyncio.sleep(0.3)
        assert reporter.reports_sent == 0  # no etcd yet: no leader known, nothing buffered
        reporter.etcd = etcd_client
        await eventually(lambda: leader.servicer.monitor.reports_received >= 2, 10, "reports at the leader")
        assert reporter.target == "placement-0"
        (chat,) = leader.servicer.monitor.stats(time.monotonic())
        assert chat.window(10).completed == 3 and chat.window(10).arrivals == 3
        # hand leadership over: the old leader's acks name the new one, the reporter follows
        await leader.servicer.election.resign()
        await standby.servicer.election.campaign()
        before = standby.servicer.monitor.reports_received
        await eventually(
            lambda: standby.servicer.monitor.reports_received > before + 1, 10, "reports at the new leader"
        )
        assert reporter.target == "placement-1"
        # the new leader dies: the reporter keeps trying (with backoff), never raises
        await standby.stop()
        await asyncio.sleep(0.5)
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await standby.stop()
        await directory.close()
