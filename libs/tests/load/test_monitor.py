"""LoadMonitor against fake engines (in-process gRPC servers): one stream per engine, listeners hear
every snapshot and every engine that leaves, a broken stream is reopened."""

from __future__ import annotations

import asyncio

from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.load import LoadBook
from llmfleet.load.monitor import LoadMonitor, report_from_proto
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.types import ENGINE_ROLE, NodeRecord


class FakeEngine(engine_pb2_grpc.EngineServicer):
    """Streams snapshots with running = 1, 2, 3, ... every ``interval_s``."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id
        self.n = 0
        self.streams = 0

    async def WatchLoad(self, request, context):
        self.streams += 1
        while True:
            self.n += 1
            yield common_pb2.LoadSnapshot(
                engine_id=self.engine_id,
                running=self.n,
                kv_used_bytes=1024,
                kv_capacity_bytes=4096,
                models=[common_pb2.ModelLoad(model="m", kv_used_bytes=1024, kv_tokens=2)],
            )
            await asyncio.sleep(request.interval_s)


async def serve(fake: FakeEngine, port: int = 0) -> GrpcServer:
    return await GrpcServer(
        [(engine_pb2_grpc.add_EngineServicer_to_server, fake, service_name(engine_pb2, "Engine"))], port=port
    ).start()


async def until(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def node(engine_id: str, address: str, role: str = ENGINE_ROLE) -> NodeRecord:
    return NodeRecord(engine_id, role, address, models=("m",))


def test_report_from_proto_derives_bytes_per_token():
    snap = common_pb2.LoadSnapshot(
        running=2,
        waiting=3,
        kv_used_bytes=10,
        kv_capacity_bytes=20,
        models=[
            common_pb2.ModelLoad(model="a", kv_used_bytes=1024, kv_tokens=2),
            common_pb2.ModelLoad(model="idle"),  # no tokens: bytes per token unknown
        ],
    )
    r = report_from_proto(snap)
    assert (r.running, r.waiting, r.kv_used_bytes, r.kv_capacity_bytes) == (2, 3, 10, 20)
    assert r.kv_bytes_per_token == {"a": 512.0}
    assert r.prefix_cached_bytes is None  # no prefix cache reported


def test_report_from_proto_sizes_the_prefix_cache_from_its_blocks():
    cache = common_pb2.PrefixCacheLoad(blocks=3, idle_blocks=1, queries=100, hits=40)
    snap = common_pb2.LoadSnapshot(kv_capacity_bytes=8192, kv_blocks_total=8, prefix_cache=cache)
    assert report_from_proto(snap).prefix_cached_bytes == 3 * 1024
    # an engine that does not count its pool in blocks (vLLM) reports lookups and hits only
    snap = common_pb2.LoadSnapshot(kv_capacity_bytes=8192, prefix_cache=cache)
    assert report_from_proto(snap).prefix_cached_bytes is None


async def test_follows_engines_reconnects_and_forgets_those_that_leave():
    a, b = FakeEngine("a"), FakeEngine("b")
    sa, sb = await serve(a), await serve(b)
    book = LoadBook()
    mon = LoadMonitor(interval_s=0.05, listeners=[book])
    try:
        mon.reconcile(
            {"a": node("a", sa.address), "b": node("b", sb.address), "s": node("s", "x", "scheduler")}
        )
        assert set(mon.engines) == {"a", "b"}  # only engines are followed
        await until(lambda: all(st.reporting for st in mon.engines.values()))
        await until(lambda: book.last_report("a") is not None and book.last_report("b") is not None)
        assert book.kv_bytes_per_token("m") == 512.0
        assert book.candidate("a", ("m",)).kv_capacity_bytes == 4096

        # a's server dies: the stream breaks (reporting False), then comes back on the same port
        port = sa.port
        await sa.stop(0)
        await until(lambda: not mon.engines["a"].reporting)
        sa = await serve(a, port)
        await until(lambda: mon.engines["a"].reporting and a.streams >= 2)
        seen = a.n
        await until(lambda: book.last_report("a").running > seen)

        # b leaves the nodes view: its stream is closed and listeners forget it
        mon.reconcile({"a": node("a", sa.address)})
        assert set(mon.engines) == {"a"} and book.last_report("b") is None
        await asyncio.sleep(0.15)
        assert book.last_report("b") is None  # nothing more arrives from b
    finally:
        await mon.close()
        await sa.stop(0)
        await sb.stop(0)


async def test_an_engine_at_a_new_address_gets_a_new_stream():
    a1, a2 = FakeEngine("a"), FakeEngine("a")
    s1, s2 = await serve(a1), await serve(a2)
    mon = LoadMonitor(interval_s=0.05)
    try:
        mon.reconcile({"a": node("a", s1.address)})
        await until(lambda: mon.engines["a"].reporting)
        mon.reconcile({"a": node("a", s2.address)})  # re-registered elsewhere
        assert mon.engines["a"].address == s2.address
        await until(lambda: a2.streams == 1 and mon.engines["a"].reporting)
    finally:
        await mon.close()
        await s1.stop(0)
        await s2.stop(0)
