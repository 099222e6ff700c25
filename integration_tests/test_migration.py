"""Live KV migration between two real engine processes (pools with different block sizes).

The request's full greedy output equals an unmigrated run (KV and TOKENS modes), neither engine leaks a block, and a
transfer that breaks midway leaves the request running on the source."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest
from harness import prepare_endless_llama
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.rpc import GrpcServer
from llmfleet.rpc.server import service_name
from llmfleet.supervisor import ProcessGroup, free_port
from llmfleet.testing import eventually
from llmfleet_engine.kv_rpc import ACCEPTED_METADATA
from util import hf_greedy, load_snapshot

BIN = Path(sys.executable).parent
PROMPT = "Move this request to another engine and keep going"
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def engines(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("migration")
    models = root / "models"
    model_dir = prepare_endless_llama(models)
    group = ProcessGroup(root / "logs")
    addresses = {}
    for name, block in (("src", "4KiB"), ("dst", "64KiB")):
        port = free_port()
        addresses[name] = f"127.0.0.1:{port}"
        group.spawn(
            name,
            [
                str(BIN / "llmfleet-engine"),
                "--id",
                name,
                "--port",
                str(port),
                "--metrics-port",
                "0",
                "--etcd",
                f"127.0.0.1:{free_port()}",
                "--models-dir",
                str(models),
                "--threads",
                "1",
                "--offline",
                "--block-bytes",
                block,
                "--memory-budget",
                "256MiB",
                "--model",
                f"{MODEL}={model_dir}",
            ],
        )
    try:
        for name, addr in addresses.items():
            group.wait_healthy(name, addr, timeout=90)
        yield addresses, model_dir
    finally:
        group.stop_all(grace=10, together=True)


async def wait_model(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)

        async def loaded() -> bool:
            info = await stub.GetInfo(engine_pb2.GetInfoRequest(), timeout=5)
            return MODEL in {m.name for m in info.models}

        await eventually(loaded, 60, f"{MODEL} loaded at {address}")


async def blocks_used(address: str) -> int:
    return (await load_snapshot(address)).kv_blocks_used


def generate_request(rid: str, n: int, resume: list[int] | None = None) -> engine_pb2.GenerateRequest:
    return engine_pb2.GenerateRequest(
        request_id=rid,
        model=MODEL,
        prompt=PROMPT,
        sampling=common_pb2.SamplingParams(max_tokens=n),
        resume_token_ids=resume or [],
    )


@pytest.mark.parametrize("mode", ["kv", "tokens"])
async def test_live_migration_continues_on_the_destination(engines, mode):
    addr, model_dir = engines
    rid = f"live-{mode}"
    await wait_model(addr["src"])
    await wait_model(addr["dst"])
    n = 1200  # still running when Migrate arrives on a loaded machine (else NOT_FOUND)
    async with (
        grpc.aio.insecure_channel(addr["src"]) as src_ch,
        grpc.aio.insecure_channel(addr["dst"]) as dst_ch,
    ):
        src, dst = engine_pb2_grpc.EngineStub(src_ch), engine_pb2_grpc.EngineStub(dst_ch)
        stream = src.Generate(generate_request(rid, n))
        tokens: list[int] = []
        async for chunk in stream:
            tokens.extend(chunk.token_ids)
            if len(tokens) >= 20:
                break
        proto_mode = engine_pb2.MIGRATE_MODE_KV if mode == "kv" else engine_pb2.MIGRATE_MODE_TOKENS
        resp = await src.Migrate(
            engine_pb2.MigrateRequest(request_id=rid, destination=addr["dst"], mode=proto_mode), timeout=60
        )
        assert resp.mode == proto_mode and resp.migration_id
        if mode == "kv":
            assert resp.num_tokens >= 20 and resp.bytes > 0
        else:  # the header alone; the destination re-prefills prompt + generated tokens
            assert resp.num_tokens == 0 and resp.bytes == 0
        final = None
        async for chunk in stream:  # the source's stream ends with MIGRATED
            tokens.extend(chunk.token_ids)
            final = chunk
        assert final.finish_reason == common_pb2.FINISH_REASON_MIGRATED and final.migrated_to == addr["dst"]
        async for chunk in dst.Generate(generate_request(rid, n, tokens)):  # attach at the destination
            assert chunk.index == len(tokens) or not chunk.token_ids
            tokens.extend(chunk.token_ids)
            final = chunk
        assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH and final.engine_id == "dst"
    assert tokens == hf_greedy(model_dir, PROMPT, n)
    await eventually(lambda: _zero(addr["src"]), 10, "no blocks left on the source")
    await eventually(lambda: _zero(addr["dst"]), 10, "no blocks left on the destination")


async def _zero(address: str) -> bool:
    return await blocks_used(address) == 0


class BrokenDestination(engine_pb2_grpc.EngineServicer):
    """Accepts the header (as an engine does, with the acceptance metadata) and one data chunk, then
    fails: a transfer broken midway."""

    def __init__(self) -> None:
        self.received = 0

    async def ImportKv(self, request_iterator, context):
        async for _ in request_iterator:
            self.received += 1
            if self.received == 1:
                await context.send_initial_metadata((ACCEPTED_METADATA,))
            if self.received == 2:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "link dropped")
        return engine_pb2.ImportKvResponse()


async def test_broken_transfer_leaves_the_request_on_the_source(engines):
    addr, model_dir = engines
    await wait_model(addr["src"])
    broken = BrokenDestination()
    server = await GrpcServer(
        [(engine_pb2_grpc.add_EngineServicer_to_server, broken, service_name(engine_pb2, "Engine"))]
    ).start()
    n = 1800  # long enough to be still running when Migrate arrives on a loaded machine (else NOT_FOUND)
    try:
        async with grpc.aio.insecure_channel(addr["src"]) as ch:
            src = engine_pb2_grpc.EngineStub(ch)
            stream = src.Generate(generate_request("broken-1", n))
            tokens: list[int] = []
            async for chunk in stream:
                tokens.extend(chunk.token_ids)
                if len(tokens) >= 10:
                    break
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await src.Migrate(
                    engine_pb2.MigrateRequest(
                        request_id="broken-1", destination=server.address, chunk_tokens=4
                    ),
                    timeout=60,
                )
            # the destination's error as gRPC reports it: its own message, or INTERNAL when its abort
            # races the source's next write on the client stream
            details = e.value.details()
            assert (
                e.value.code() == grpc.StatusCode.ABORTED
                and f"transfer to {server.address} failed" in details
            )
            assert "link dropped" in details or "INTERNAL" in details
            assert broken.received == 2
            async for chunk in stream:
                tokens.extend(chunk.token_ids)
                final = chunk
            assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH and final.engine_id == "src"
    finally:
        await server.stop(0)
    assert tokens == hf_greedy(model_dir, PROMPT, n)
    await eventually(lambda: _zero(addr["src"]), 10, "no blocks left on the source")


async def test_import_with_unknown_model_is_failed_precondition(engines):
    addr, _ = engines
    await wait_model(addr["dst"])

    async def chunks():
        yield engine_pb2.KvChunk(
            header=engine_pb2.KvTransferHeader(
                request_id="x",
                model="ghost",
                shape=engine_pb2.KvShape(num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32"),
                num_tokens=4,
                prompt_token_ids=[1, 2, 3, 4],
                generated_token_ids=[5],
                sampling=common_pb2.SamplingParams(max_tokens=8),
            )
        )

    before = await blocks_used(addr["dst"])
    async with grpc.aio.insecure_channel(addr["dst"]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await engine_pb2_grpc.EngineStub(ch).ImportKv(chunks(), timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "ghost" in e.value.details()
    assert await blocks_used(addr["dst"]) == before
