"""Migrate as a coordinator drives it, between two in-process engines (real executors behind real gRPC
servicers): KV and TOKENS modes keep the unmigrated output, several migrations run at once up to
--max-migrations, migration ids are idempotent, failures leave the request on its source; MeasureLink
and the link estimates in GetInfo; per-request load in WatchLoad snapshots."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from chunk_checks import read
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.supervisor import free_port
from llmfleet.testing import eventually
from llmfleet_engine.executor import Executor
from llmfleet_engine.servicer import EngineServicer

PROMPT = "Move this request to another engine and keep going"
N = 240
STEP_S = 0.003  # engine a's forward is slowed by this much, so a request is still running when moved
KV, TOKENS = engine_pb2.MIGRATE_MODE_KV, engine_pb2.MIGRATE_MODE_TOKENS


@dataclass
class Node:
    engine_id: str
    executor: Executor
    servicer: EngineServicer
    address: str
    stub: engine_pb2_grpc.EngineStub


def throttle(ex: Executor, seconds: float) -> None:
    """Every forward of ``ex`` takes ``seconds`` longer (the outputs do not change)."""
    for hosted in ex.host.hosted.values():
        forward = hosted.runner.forward

        def slow(steps, _forward=forward):
            time.sleep(seconds)
            return _forward(steps)

        hosted.runner.forward = slow


async def serve(servicer: engine_pb2_grpc.EngineServicer) -> GrpcServer:
    return await GrpcServer(
        [(engine_pb2_grpc.add_EngineServicer_to_server, servicer, service_name(engine_pb2, "Engine"))]
    ).start()


@pytest.fixture
async def nodes(make_executor) -> AsyncIterator[Callable[..., Node]]:
    servers, channels = [], []

    async def make(
        engine_id: str,
        slow: bool = False,
        executor_kw: dict | None = None,
        servicer_cls: type[EngineServicer] = EngineServicer,
        **servicer_kw,
    ) -> Node:
        executor = make_executor(**(executor_kw or {}))
        if slow:
            throttle(executor, STEP_S)
        servicer = servicer_cls(executor, engine_id, **servicer_kw)
        server = await serve(servicer)
        channel = open_channel(server.address)
        servers.append(server)
        channels.append(channel)
        return Node(engine_id, executor, servicer, server.address, engine_pb2_grpc.EngineStub(channel))

    try:
        yield make
    finally:
        for ch in channels:
            await ch.close()
        for s in servers:
            await s.stop(0)


@pytest.fixture
async def pair(nodes) -> tuple[Node, Node]:
    return await nodes("a", slow=True), await nodes("b")


@pytest.fixture(scope="module")
def reference() -> dict[tuple, list[int]]:
    return {}


def request(rid: str, model: str, n: int = N, resume=(), **sampling) -> engine_pb2.GenerateRequest:
    return engine_pb2.GenerateRequest(
        request_id=rid,
        model=model,
        prompt=PROMPT,
        sampling=common_pb2.SamplingParams(max_tokens=n, **sampling),
        resume_token_ids=list(resume),
    )


async def expected(node: Node, model: str, cache: dict, **sampling) -> list[int]:
    """The unmigrated output (computed once per module and sampling)."""
    key = (model, tuple(sorted(sampling.items())))
    if key not in cache:
        call = node.stub.Generate(request("reference", model, **sampling))
        cache[key] = [t async for c in call for t in c.token_ids]
        assert len(cache[key]) == N
    return cache[key]


def migrate(rid: str, dest: str, mode=KV, migration_id: str = "") -> engine_pb2.MigrateRequest:
    return engine_pb2.MigrateRequest(request_id=rid, destination=dest, mode=mode, migration_id=migration_id)


async def finish_moved(a: Node, b: Node, call, tokens: list[int], rid: str, model: str, **sampling) -> None:
    """The source stream ends MIGRATED; the rest comes from b (the scheduler's attach)."""
    final = await read(call, tokens)
    assert final.finish_reason == common_pb2.FINISH_REASON_MIGRATED and final.migrated_to == b.address
    final = await read(b.stub.Generate(request(rid, model, resume=tokens, **sampling)), tokens)
    assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH and final.engine_id == "b"


async def failed_move(a: Node, dest: str, model: str, mode=KV) -> tuple[Any, list[int], str]:
    """Request "r" started on a, then a Migrate to ``dest`` that fails (ABORTED): the stream, its first
    tokens and the error's details."""
    call = a.stub.Generate(request("r", model))
    tokens: list[int] = []
    await read(call, tokens, 10)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await a.stub.Migrate(migrate("r", dest, mode), timeout=30)
    assert e.value.code() == grpc.StatusCode.ABORTED
    return call, tokens, e.value.details() or ""


async def finish_here(call, tokens: list[int]) -> None:
    final = await read(call, tokens)
    assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH and final.engine_id == "a"


@pytest.mark.parametrize("mode", [KV, TOKENS], ids=["kv", "tokens"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "seed": 7}], ids=["greedy", "seeded"])
async def test_both_modes_keep_the_unmigrated_output(pair, endless, reference, mode, sampling) -> None:
    a, b = pair
    want = await expected(b, endless.name, reference, **sampling)
    call = a.stub.Generate(request("r", endless.name, **sampling))
    tokens: list[int] = []
    await read(call, tokens, 10)
    resp = await a.stub.Migrate(migrate("r", b.address, mode, "mig-1"), timeout=30)
    assert resp.mode == mode and resp.migration_id == "mig-1" and resp.request_id == "r"
    if mode == KV:
        assert resp.num_tokens >= 10 + len(endless.tokenizer(PROMPT)["input_ids"]) - 1
        assert resp.bytes == resp.num_tokens * endless.kv_bytes_per_token
    else:
        assert (resp.num_tokens, resp.bytes) == (0, 0)  # the header alone: b re-prefills
    await finish_moved(a, b, call, tokens, "r", endless.name, **sampling)
    assert tokens == want
    await eventually(lambda: a.executor.load_snapshot().kv_blocks_used == 0, 5, "a's blocks freed")
    await eventually(lambda: b.executor.load_snapshot().kv_blocks_used == 0, 5, "b's blocks freed")


async def test_several_migrations_in_flight(pair, endless, reference) -> None:
    a, b = pair
    want = await expected(b, endless.name, reference)
    rids = [f"r{i}" for i in range(4)]
    calls = {rid: a.stub.Generate(request(rid, endless.name)) for rid in rids}
    tokens: dict[str, list[int]] = {rid: [] for rid in rids}
    for rid in rids:
        await read(calls[rid], tokens[rid], 5)
    modes = [KV, TOKENS, KV, TOKENS]
    resps = await asyncio.gather(
        *(a.stub.Migrate(migrate(rid, b.address, m), timeout=30) for rid, m in zip(rids, modes, strict=True))
    )
    assert [r.mode for r in resps] == modes
    assert len({r.migration_id for r in resps}) == 4 and all(resps[0].migration_id)  # assigned ids
    for rid in rids:
        await finish_moved(a, b, calls[rid], tokens[rid], rid, endless.name)
        assert tokens[rid] == want, rid


async def test_migration_ids_are_idempotent(pair, endless, reference) -> None:
    a, b = pair
    want = await expected(b, endless.name, reference)
    call = a.stub.Generate(request("r", endless.name))
    tokens: list[int] = []
    await read(call, tokens, 10)
    first, second = await asyncio.gather(  # the second joins the first, in flight
        a.stub.Migrate(migrate("r", b.address, KV, "same"), timeout=30),
        a.stub.Migrate(migrate("r", b.address, KV, "same"), timeout=30),
    )
    assert first == second and first.migration_id == "same"
    again = await a.stub.Migrate(migrate("r", b.address, KV, "same"), timeout=30)  # completed: recorded
    assert again == first
    await finish_moved(a, b, call, tokens, "r", endless.name)
    assert tokens == want

    with pytest.raises(grpc.aio.AioRpcError) as e:  # the id names another migration
        await a.stub.Migrate(migrate("other", b.address, KV, "same"), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'r'" in e.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as e:  # moved already: a new id finds nothing here
        await a.stub.Migrate(migrate("r", b.address, KV, "new"), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert f"migration same moved it to {b.address}" in e.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await a.stub.Migrate(migrate("ghost", b.address), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "'ghost' is not on engine a" in e.value.details()


class HeldDestination(engine_pb2_grpc.EngineServicer):
    """Takes the header, then holds the transfer until released, then fails it (a stalled link)."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def ImportKv(self, request_iterator, context):
        await anext(aiter(request_iterator))
        self.arrived.set()
        await self.release.wait()
        await context.abort(grpc.StatusCode.UNAVAILABLE, "link dropped")


async def test_the_limit_and_a_second_migration_of_a_request_moving(nodes, endless, reference) -> None:
    a = await nodes("a", slow=True, max_migrations=1)
    b = await nodes("b")
    want = await expected(b, endless.name, reference)
    held = HeldDestination()
    server = await serve(held)
    try:
        calls = {rid: a.stub.Generate(request(rid, endless.name)) for rid in ("r1", "r2")}
        tokens: dict[str, list[int]] = {"r1": [], "r2": []}
        for rid, call in calls.items():
            await read(call, tokens[rid], 5)
        info = await a.stub.GetInfo(engine_pb2.GetInfoRequest())
        assert info.max_migrations == 1
        stuck = asyncio.ensure_future(a.stub.Migrate(migrate("r1", server.address, KV, "m1"), timeout=30))
        await asyncio.wait_for(held.arrived.wait(), 10)
        with pytest.raises(grpc.aio.AioRpcError) as e:  # beyond the limit
            await a.stub.Migrate(migrate("r2", b.address), timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-migrations 1" in e.value.details()
        a.servicer.migrations.max_in_flight = 2
        with pytest.raises(grpc.aio.AioRpcError) as e:  # r1 is moving already
            await a.stub.Migrate(migrate("r1", b.address, KV, "m2"), timeout=30)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "already being migrated" in e.value.details()
        held.release.set()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stuck
        assert e.value.code() == grpc.StatusCode.ABORTED and "link dropped" in e.value.details()
        # the failed outcome is recorded under its id; the request carries on here
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await a.stub.Migrate(migrate("r1", server.address, KV, "m1"), timeout=30)
        assert e.value.code() == grpc.StatusCode.ABORTED
        await a.stub.Migrate(migrate("r2", b.address), timeout=30)
        await finish_moved(a, b, calls["r2"], tokens["r2"], "r2", endless.name)
        await finish_here(calls["r1"], tokens["r1"])
        assert tokens["r1"] == want and tokens["r2"] == want
    finally:
        await server.stop(0)


@pytest.mark.parametrize("mode", [KV, TOKENS], ids=["kv", "tokens"])
async def test_a_destination_without_the_model_leaves_the_request_here(pair, endless, reference, mode):
    a, b = pair
    want = await expected(a, endless.name, reference)
    assert await asyncio.to_thread(b.executor.host.unload, endless.name)
    call, tokens, details = await failed_move(a, b.address, endless.name, mode)
    assert "FAILED_PRECONDITION" in details and "not loaded" in details and "continues here" in details
    await finish_here(call, tokens)
    assert tokens == want
    assert b.executor.load_snapshot().kv_blocks_used == 0


async def test_an_unreachable_destination_leaves_the_request_here(pair, endless, reference) -> None:
    a, b = pair
    want = await expected(b, endless.name, reference)
    call, tokens, details = await failed_move(a, f"127.0.0.1:{free_port()}", endless.name)
    assert "UNAVAILABLE" in details
    await finish_here(call, tokens)
    assert tokens == want
    await eventually(lambda: a.executor.load_snapshot().kv_blocks_used == 0, 5, "a's blocks freed")


class LosesImportReplies(EngineServicer):
    """Commits every import, then fails the call as a link that drops before the reply arrives."""

    async def ImportKv(self, request_iterator, context) -> engine_pb2.ImportKvResponse:
        await super().ImportKv(request_iterator, context)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the reply is lost")


@pytest.mark.parametrize("mode", [KV, TOKENS], ids=["kv", "tokens"])
async def test_a_lost_import_reply_leaves_the_request_in_one_place(nodes, endless, reference, mode) -> None:
    a = await nodes("a", slow=True)
    b = await nodes("b", servicer_cls=LosesImportReplies, unattached_timeout_s=600.0)
    want = await expected(a, endless.name, reference)
    call, tokens, details = await failed_move(a, b.address, endless.name, mode)
    assert "UNAVAILABLE" in details and "continues here" in details
    # b had committed the import (its reply was lost): the source cancelled that copy at once, long
    # before b's unattached timeout would have
    snap = b.executor.load_snapshot()
    assert (snap.running, snap.waiting) == (0, 0) and b.executor.attach("r") is None
    await eventually(lambda: b.executor.load_snapshot().kv_blocks_used == 0, 5, "b's blocks freed")
    await finish_here(call, tokens)
    assert tokens == want


async def test_measure_link_and_the_estimates_in_get_info(pair, endless) -> None:
    a, b = pair
    n = 3 * (1 << 20) + 5
    resp = await a.stub.MeasureLink(engine_pb2.MeasureLinkRequest(destination=b.address, bytes=n))
    assert resp.destination == b.address and resp.bytes == n and resp.seconds > 0
    assert resp.bytes_per_s == pytest.approx(n / resp.seconds)
    (link,) = (await a.stub.GetInfo(engine_pb2.GetInfoRequest())).links
    assert (link.destination, link.source, link.bytes) == (b.address, "probe", n)
    assert link.bytes_per_s == pytest.approx(resp.bytes_per_s) and link.timestamp > 0
    default = await a.stub.MeasureLink(engine_pb2.MeasureLinkRequest(destination=b.address))
    assert default.bytes == 8 << 20

    a.servicer.links.min_bytes = 0  # tiny test requests: record every KV transfer
    call = a.stub.Generate(request("r", endless.name))
    await read(call, [], 10)
    moved = await a.stub.Migrate(migrate("r", b.address), timeout=30)
    call.cancel()
    (link,) = (await a.stub.GetInfo(engine_pb2.GetInfoRequest())).links
    assert (link.source, link.bytes) == ("migration", moved.bytes)
    assert link.bytes_per_s == pytest.approx(moved.bytes / moved.transfer_s)

    with pytest.raises(grpc.aio.AioRpcError) as e:
        await a.stub.MeasureLink(engine_pb2.MeasureLinkRequest(destination=f"127.0.0.1:{free_port()}"))
    assert e.value.code() == grpc.StatusCode.ABORTED and "probe to" in e.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await a.stub.MeasureLink(engine_pb2.MeasureLinkRequest(destination=b.address, bytes=(1 << 30) + 1))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_watch_load_reports_every_request(nodes, endless) -> None:
    a = await nodes("a", slow=True)
    call = a.stub.Generate(request("r", endless.name))
    await read(call, [], 5)
    watch = a.stub.WatchLoad(engine_pb2.WatchLoadRequest(interval_s=0.05))
    snap = await anext(aiter(watch))
    watch.cancel()
    (r,) = snap.requests
    prompt = len(endless.tokenizer(PROMPT)["input_ids"])
    assert (r.request_id, r.model, r.phase) == ("r", endless.name, "decode")
    assert r.tokens >= prompt + 5 and r.kv_bytes >= (r.tokens - 1) * endless.kv_bytes_per_token
    assert sum(q.kv_bytes for q in snap.requests) == sum(m.kv_used_bytes for m in snap.models)
    call.cancel()


async def test_a_waiting_request_moves_in_token_mode(nodes, endless, reference) -> None:
    """What Aladdin's rebalance asks of an engine: a request still queued (no token, no KV) moves with
    its prompt alone and runs whole at the destination."""
    a = await nodes("a", slow=True, executor_kw={"max_running": 1})
    b = await nodes("b")
    want = await expected(b, endless.name, reference)
    busy = a.stub.Generate(request("busy", endless.name))
    first: list[int] = []
    await read(busy, first, 1)  # running: the only slot
    queued = a.stub.Generate(request("queued", endless.name))
    await asyncio.sleep(0.2)
    resp = await a.stub.Migrate(migrate("queued", b.address, TOKENS), timeout=30)
    assert resp.num_tokens == 0 and resp.bytes == 0
    tokens: list[int] = []
    await finish_moved(a, b, queued, tokens, "queued", endless.name)
    assert tokens == want
    busy.cancel()


def _import_header(ex: Executor, endless, **fields) -> engine_pb2.KvTransferHeader:
    s = ex.host.hosted[endless.name].shape
    h = engine_pb2.KvTransferHeader(
        request_id="imported",
        model=endless.name,
        shape=engine_pb2.KvShape(
            num_layers=s.num_layers, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, dtype=s.dtype
        ),
        prompt_token_ids=[1, 2, 3],
    )
    h.sampling.max_tokens = 2
    for k, v in fields.items():
        msg, name = (h.sampling, k.removeprefix("sampling.")) if k.startswith("sampling.") else (h, k)
        if isinstance(v, list):
            del getattr(msg, name)[:]
            getattr(msg, name).extend(v)
        else:
            setattr(msg, name, v)
    return h


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        # found by fuzzing: a negative id reached the tokenizer: UNKNOWN "StreamInput must be ..."
        ({"generated_token_ids": [-1]}, "header.generated_token_ids"),
        ({"prompt_token_ids": [5, -7]}, "header.prompt_token_ids"),
        ({"prompt_token_ids": [2**31 - 1]}, "vocabulary"),
        ({"sampling.temperature": float("nan")}, "header.sampling.temperature"),
        ({"sampling.top_p": 2.0}, "header.sampling.top_p"),
        ({"sampling.stop": [""]}, "header.sampling.stop"),
    ],
)
async def test_import_kv_refuses_bad_headers_naming_the_field(nodes, endless, fields, named) -> None:
    node = await nodes("a")
    header = _import_header(node.executor, endless, **fields)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await node.stub.ImportKv(iter([engine_pb2.KvChunk(header=header)]), timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
    assert named in e.value.details()
    assert node.executor.load_snapshot().kv_blocks_used == 0
    # the engine still serves: a valid header imports
    ok = await node.stub.ImportKv(
        iter([engine_pb2.KvChunk(header=_import_header(node.executor, endless))]), timeout=10
    )
    assert ok.request_id == "imported"
