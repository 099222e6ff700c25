"""Multiplexed streams (``llmfleet.rpc.mux``) over a real gRPC server on loopback: many requests on one
call, per-stream statuses with pushback, cancel and deadline reaching the server's handler, a broken
call failing its streams (UNAVAILABLE) and the next open starting a new call, the callback path."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.mux import GENERATE_MANY, PUSHBACK, MuxLink, StreamRefused, serve_many
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.security import SecuritySettings


class Tokens(engine_pb2_grpc.EngineServicer):
    """GenerateMany: ``max_tokens`` chunks one loop turn apart; prompts ``refuse``, ``hang`` and
    ``burst`` (all chunks at once) behave as named."""

    def __init__(self) -> None:
        self.stopped: list[str] = []  # handlers cancelled (cancel, deadline, call gone)
        self.batches: list[int] = []  # chunks per batch written

    async def GenerateMany(self, request_iterator, context):
        async for batch in serve_many(request_iterator, self.run, method=GENERATE_MANY, name="test"):
            self.batches.append(len(batch.chunks))
            yield batch

    async def run(self, req: engine_pb2.GenerateRequest, timeout_s: float | None, emit) -> None:
        rid, n = req.request_id, req.sampling.max_tokens
        try:
            if req.prompt == "refuse":
                raise StreamRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, "too busy", retry_after_s=2.5)
            if req.prompt == "hang":
                await asyncio.sleep(3600)
            for i in range(n):
                emit(common_pb2.TokenChunk(request_id=rid, index=i, token_ids=[i], text=f"t{i}"))
                if req.prompt != "burst":
                    await asyncio.sleep(0)
            emit(
                common_pb2.TokenChunk(request_id=rid, index=n, finish_reason=common_pb2.FINISH_REASON_LENGTH)
            )
        except asyncio.CancelledError:
            self.stopped.append(rid)
            raise


async def serve(servicer: Tokens, port: int = 0) -> GrpcServer:
    reg = (engine_pb2_grpc.add_EngineServicer_to_server, servicer, service_name(engine_pb2, "Engine"))
    return await GrpcServer([reg], port=port, security=SecuritySettings().validated()).start()


def request(rid: str, n: int = 4, prompt: str = "hi") -> engine_pb2.GenerateRequest:
    return engine_pb2.GenerateRequest(
        request_id=rid, model="m", prompt=prompt, sampling=common_pb2.SamplingParams(max_tokens=n)
    )


@pytest.fixture
async def setup():
    servicer = Tokens()
    server = await serve(servicer)
    channel = open_channel(server.address, SecuritySettings())
    stub = engine_pb2_grpc.EngineStub(channel)
    link = MuxLink(lambda: stub.GenerateMany(), engine_pb2.GenerateCommands, GENERATE_MANY, name="test")
    yield servicer, server, link
    await link.close()
    await channel.close()
    await server.stop(0)


async def test_many_streams_share_one_call_and_keep_their_order(setup) -> None:
    servicer, _server, link = setup
    streams = [link.open(f"r{i}", request(f"r{i}", n=5 + i)) for i in range(20)]
    results = await asyncio.gather(*[_collect(s) for s in streams])
    for i, chunks in enumerate(results):
        assert [c.index for c in chunks] == list(range(5 + i + 1))
        assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert all(c.request_id == f"r{i}" for c in chunks)
    assert link.calls_opened == 1
    assert sum(servicer.batches) == sum(6 + i for i in range(20))
    assert len(servicer.batches) < sum(servicer.batches) / 2  # chunks ready together went together
    assert link.streams == {}


async def test_a_refused_stream_gets_its_status_and_pushback_others_go_on(setup) -> None:
    _servicer, _server, link = setup
    bad = link.open("bad", request("bad", prompt="refuse"))
    good = link.open("good", request("good", n=3))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _collect(bad)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details() == "too busy"
    assert dict(err.value.trailing_metadata())[PUSHBACK] == "2500"
    assert len(await _collect(good)) == 4


async def test_cancel_stops_the_servers_handler(setup) -> None:
    servicer, _server, link = setup
    stream = link.open("h", request("h", prompt="hang"))
    reader = asyncio.create_task(_collect(stream))
    await asyncio.sleep(0.2)
    assert stream.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    await _until(lambda: servicer.stopped == ["h"])
    assert len(await _collect(link.open("after", request("after", n=2)))) == 3  # the call lives on


async def test_deadline_fails_the_stream_and_stops_the_handler(setup) -> None:
    servicer, _server, link = setup
    stream = link.open("slow", request("slow", prompt="hang"), timeout_s=0.3)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _collect(stream)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await _until(lambda: "slow" in servicer.stopped)


async def test_a_broken_call_fails_its_streams_unavailable_and_the_next_open_starts_a_new_one(setup) -> None:
    servicer, server, link = setup
    port = server.port
    stream = link.open("h", request("h", prompt="hang"))
    await asyncio.sleep(0.2)
    await server.stop(0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _collect(stream)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    again = await serve(servicer, port=port)
    try:
        chunks = await _retry(lambda: _collect(link.open("new", request("new", n=2))))
        assert len(chunks) == 3 and link.calls_opened >= 2
    finally:
        await again.stop(0)


async def test_callback_takes_chunks_and_iteration_yields_only_the_final_one(setup) -> None:
    _servicer, _server, link = setup
    taken: list[int] = []
    stream = link.open("cb", request("cb", n=6, prompt="burst"))
    stream.on_chunk = lambda c: taken.append(c.index)
    chunks = await _collect(stream)
    assert taken == list(range(6))
    assert [c.finish_reason for c in chunks] == [common_pb2.FINISH_REASON_LENGTH]


async def test_same_id_twice_on_one_link_is_refused_locally(setup) -> None:
    _servicer, _server, link = setup
    first = link.open("dup", request("dup", prompt="hang"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _collect(link.open("dup", request("dup")))
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    first.cancel()


async def _collect(stream) -> list[common_pb2.TokenChunk]:
    return [c async for c in stream]


async def _until(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def _retry(make, attempts: int = 50):
    for i in range(attempts):
        try:
            return await make()
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or i == attempts - 1:
                raise
            await asyncio.sleep(0.1)


async def test_an_empty_request_id_is_refused_naming_the_field(setup) -> None:
    _servicer, _server, link = setup
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _collect(link.open("", request("")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request_id" in err.value.details()
