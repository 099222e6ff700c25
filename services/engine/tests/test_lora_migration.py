"""Migrating a request of a LoRA adapter between two in-process native engines (real executors behind
real gRPC servicers, as the migration coordinator drives them): it travels as its base's KV with the
adapter named, takes the adapter's slot on the destination and finishes with the tokens of HF
``generate`` on the merged adapter; a destination without the adapter refuses it before any K/V is
sent, and the source keeps and finishes it; a base leaving an engine takes its adapters' requests with it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from chunk_checks import read
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.rpc.channels import open_channel
from llmfleet.testing import eventually
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, ModelSpec, NodeRecord
from llmfleet_engine.emulated import EmulatedConfig, EmulatedExecutor
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.models import load_model
from llmfleet_engine.placement_follower import DrainSettings, PlacementFollower
from llmfleet_engine.servicer import EngineServicer, snapshot_to_proto
from llmfleet_engine.validation import build_request
from lora_checkpoints import hf_greedy, merged, save_checkpoints
from test_drain import FakeNodes
from test_migrate_rpc import KV, TOKENS, Node, migrate, serve, throttle

BASE = "lora-base"
ADAPTER = "all"  # rank 8 on all seven projections
N = 24
PROMPT = "Once upon a time there was a little town by the river."
STEP_S = 0.02  # the source's forwards are slowed, so the request is still running when it moves


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, dict[str, Path]]:
    return save_checkpoints(tmp_path_factory.mktemp("lora-migration"), cache_dir)


@pytest.fixture(scope="module")
def want(checkpoints, cache_dir: Path) -> list[int]:
    """HF ``generate`` on the base with the adapter merged: what the request must produce."""
    base_dir, dirs = checkpoints
    base = load_model(ModelSpec(name=BASE, source=str(base_dir)), cache_dir=cache_dir, allow_download=False)
    ids = build_request(base, PROMPT, request_id="x", max_tokens=N).prompt_token_ids
    out = hf_greedy(merged(base_dir, dirs[ADAPTER]), ids, N)
    assert len(out) > 8  # long enough to move mid-way
    return out


@pytest.fixture
async def nodes(checkpoints, cache_dir: Path) -> AsyncIterator[Callable[..., Node]]:
    """``make(engine_id, adapters, slow)``: an engine hosting the base with ``adapters`` registered."""
    base_dir, dirs = checkpoints
    made: list[tuple[Executor, object, object]] = []

    async def make(engine_id: str, adapters: tuple[str, ...], slow: bool = False) -> Node:
        ex = Executor(ExecutorConfig(cache_dir=cache_dir, allow_download=False, max_loras=1, max_lora_rank=8))
        base = load_model(
            ModelSpec(name=BASE, source=str(base_dir)), cache_dir=cache_dir, allow_download=False
        )
        ex.host.add_loaded(base)
        for name in adapters:
            ex.adapters.add(name, BASE, dirs[name])
        if slow:
            throttle(ex, STEP_S)
        servicer = EngineServicer(ex, engine_id)
        server = await serve(servicer)
        channel = open_channel(server.address)
        made.append((ex, server, channel))
        return Node(engine_id, ex, servicer, server.address, engine_pb2_grpc.EngineStub(channel))

    try:
        yield make
    finally:
        for ex, server, channel in made:
            await channel.close()  # type: ignore[attr-defined]
            await server.stop(0)  # type: ignore[attr-defined]
            ex.close()


def request(rid: str, model: str, resume=()) -> engine_pb2.GenerateRequest:
    return engine_pb2.GenerateRequest(
        request_id=rid,
        model=model,
        prompt=PROMPT,
        sampling=common_pb2.SamplingParams(max_tokens=N),
        resume_token_ids=list(resume),
    )


@pytest.mark.parametrize("mode", [KV, TOKENS], ids=["kv", "tokens"])
async def test_an_adapters_request_migrates_takes_the_slot_and_keeps_its_tokens(nodes, want, mode) -> None:
    a = await nodes("a", ("qv", ADAPTER), slow=True)
    b = await nodes("b", (ADAPTER, "mlp"))
    call = a.stub.Generate(request("r", ADAPTER))
    tokens: list[int] = []
    await read(call, tokens, 4)
    # the load report names the adapter beside its base, as the coordinator reads it
    (row,) = snapshot_to_proto(a.executor.load_snapshot(), "a").requests
    assert (row.request_id, row.model, row.adapter) == ("r", BASE, ADAPTER)
    resp = await a.stub.Migrate(migrate("r", b.address, mode, "mig-lora"), timeout=30)
    assert resp.request_id == "r" and resp.mode == mode
    final = await read(call, tokens)
    assert final.finish_reason == common_pb2.FINISH_REASON_MIGRATED and final.migrated_to == b.address
    # the import takes the adapter's slot (with its KV at once; to re-prefill, when admitted)
    await eventually(lambda: b.executor.adapters.resident(BASE) == [ADAPTER], 5, "b's slot taken")
    final = await read(b.stub.Generate(request("r", ADAPTER, resume=tokens)), tokens)
    assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH and final.engine_id == "b"
    assert tokens == want
    await eventually(lambda: a.executor.load_snapshot().kv_blocks_used == 0, 5, "a's blocks freed")
    await eventually(lambda: b.executor.load_snapshot().kv_blocks_used == 0, 5, "b's blocks freed")


@pytest.mark.parametrize("mode", [KV, TOKENS], ids=["kv", "tokens"])
async def test_a_destination_without_the_adapter_refuses_and_the_source_keeps_it(nodes, want, mode) -> None:
    a = await nodes("a", ("qv", ADAPTER), slow=True)
    b = await nodes("b", ("qv", "mlp"))  # hosts the base, not the adapter
    call = a.stub.Generate(request("r", ADAPTER))
    tokens: list[int] = []
    await read(call, tokens, 4)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await a.stub.Migrate(migrate("r", b.address, mode), timeout=30)
    assert e.value.code() == grpc.StatusCode.ABORTED
    assert f"LoRA adapter {ADAPTER!r} of {BASE!r} is not registered here" in e.value.details()
    assert "continues here" in e.value.details()
    final = await read(call, tokens)
    assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH and final.engine_id == "a"
    assert tokens == want  # nothing lost
    snap = b.executor.load_snapshot()
    assert (snap.kv_blocks_used, len(snap.requests), b.executor.adapters.resident(BASE)) == (0, 0, [])


async def test_a_draining_base_moves_its_adapters_requests_to_an_engine_serving_the_adapter(
    nodes, want
) -> None:
    """Placement moves the base off engine a (drain mode migrate): its adapter's running request is one
    of the base's requests and moves with its KV to b, which serves the adapter."""
    a = await nodes("a", (ADAPTER,), slow=True)
    b = await nodes("b", (ADAPTER,))
    fake = FakeNodes()
    fake.records["b"] = NodeRecord("b", ENGINE_ROLE, b.address, models=(ADAPTER, BASE))
    follower = PlacementFollower(
        "a", a.executor.host, a.executor.migration, drain=DrainSettings(mode="migrate"), nodes=fake
    )
    call = a.stub.Generate(request("r", ADAPTER))
    tokens: list[int] = []
    await read(call, tokens, 4)
    assert a.executor.host.model_request_ids(BASE) == ["r"]
    spec = b.executor.host.hosted[BASE].loaded.spec
    await follower.step({"a": DesiredPlacement("a", ()), "b": DesiredPlacement("b", (spec,))})
    final = await read(call, tokens)
    assert final.finish_reason == common_pb2.FINISH_REASON_MIGRATED and final.migrated_to == b.address
    final = await read(b.stub.Generate(request("r", ADAPTER, resume=tokens)), tokens)
    assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH and final.engine_id == "b"
    assert tokens == want


async def test_an_emulated_engines_adapter_request_migrates_with_the_same_tokens() -> None:
    """The emulated engines share the migration path (``EmulatedMigration``): an adapter's request of
    Llama-2-7B on emulated A100s moves to an engine serving the adapter, takes its slot there and ends
    with the tokens it produces unmoved."""
    model, n = "llama2-7b", 200

    def make() -> EmulatedExecutor:
        ex = EmulatedExecutor(
            EmulatedConfig(hardware="a100-80gb", sim_models={model: model}, max_loras=1, max_lora_rank=16)
        )
        ex.host.load(ModelSpec(model, f"emulated://{model}"))
        ex.adapters.add("a0", model, "emulated://r8")
        return ex

    def gen(rid: str, resume=()) -> engine_pb2.GenerateRequest:
        return engine_pb2.GenerateRequest(
            request_id=rid, model="a0", prompt="t1 t2 t3 t4",
            sampling=common_pb2.SamplingParams(max_tokens=n), resume_token_ids=list(resume),
        )  # fmt: skip

    engines = [make(), make()]
    servers = [await serve(EngineServicer(ex, eid)) for ex, eid in zip(engines, "ab", strict=True)]
    channels = [open_channel(s.address) for s in servers]
    a, b = (engine_pb2_grpc.EngineStub(c) for c in channels)
    try:
        want = [t async for c in b.Generate(gen("r")) for t in c.token_ids]  # unmoved (ids pick tokens)
        assert len(want) == n
        call = a.Generate(gen("r"))
        tokens: list[int] = []
        await read(call, tokens, 4)
        await a.Migrate(migrate("r", servers[1].address, KV, "mig-emu"), timeout=30)
        final = await read(call, tokens)
        assert final.finish_reason == common_pb2.FINISH_REASON_MIGRATED
        assert engines[1].adapters.resident(model) == ["a0"]
        final = await read(b.Generate(gen("r", resume=tokens)), tokens)
        assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH and final.engine_id == "b"
        assert tokens == want
    finally:
        for c in channels:
            await c.close()
        for s in servers:
            await s.stop(0)
        for ex in engines:
            await ex.aclose()
