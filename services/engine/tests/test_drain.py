"""Replacement loses nothing: a model leaving an engine is loaded-first, handed off, drained (its
running requests finish here, move with their KV, or are evicted to resume elsewhere), then unloaded.

Two in-process engines (real executors behind real gRPC servicers); the placement follower is driven
one pass at a time with the desired state of every engine and a stand-in for the nodes view."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest
from chunk_checks import read
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, ModelSpec, NodeRecord
from llmfleet_engine.executor import Executor
from llmfleet_engine.models import LoadedModel
from llmfleet_engine.placement_follower import DrainSettings, PlacementFollower
from llmfleet_engine.servicer import EngineServicer

PROMPT = "The quick brown fox"
N = 1500  # long enough to be running when the drain acts; the endless llama never stops early


@dataclass
class Node:
    engine_id: str
    executor: Executor
    address: str
    stub: engine_pb2_grpc.EngineStub


@dataclass
class FakeNodes:
    """Stands in for the nodes ``PrefixView`` (``step`` reads ``snapshot()``; ``run`` subscribes)."""

    records: dict[str, NodeRecord] = field(default_factory=dict)

    def snapshot(self) -> dict[str, NodeRecord]:
        return dict(self.records)

    async def subscribe(self) -> AsyncIterator[tuple[int, dict[str, NodeRecord]]]:
        yield 0, self.snapshot()  # never changes by itself

    def advertise(self, node: Node, *models: str) -> None:
        self.records[node.engine_id] = NodeRecord(node.engine_id, ENGINE_ROLE, node.address, models=models)


@pytest.fixture
async def nodes(make_executor) -> AsyncIterator[tuple[Node, Node]]:
    servers, channels, out = [], [], []
    for eid in ("a", "b"):
        executor = make_executor()
        server = await GrpcServer(
            [
                (
                    engine_pb2_grpc.add_EngineServicer_to_server,
                    EngineServicer(executor, eid),
                    service_name(engine_pb2, "Engine"),
                )
            ]
        ).start()
        channel = open_channel(server.address)
        servers.append(server)
        channels.append(channel)
        out.append(Node(eid, executor, server.address, engine_pb2_grpc.EngineStub(channel)))
    try:
        yield out[0], out[1]
    finally:
        for ch in channels:
            await ch.close()
        for s in servers:
            await s.stop(0)


@pytest.fixture(scope="module")
def reference() -> dict[int, list[int]]:
    return {}


async def expected(node: Node, model: str, cache: dict[int, list[int]]) -> list[int]:
    """The uninterrupted greedy output (computed once per module)."""
    if N not in cache:
        cache[N] = [t async for c in node.stub.Generate(request("ref", model)) for t in c.token_ids]
    return cache[N]


def request(rid: str, model: str, resume: list[int] | None = None) -> engine_pb2.GenerateRequest:
    return engine_pb2.GenerateRequest(
        request_id=rid,
        model=model,
        prompt=PROMPT,
        sampling=common_pb2.SamplingParams(max_tokens=N),
        resume_token_ids=resume or [],
    )


def placements(**engines: tuple[LoadedModel, ...]) -> dict[str, DesiredPlacement]:
    return {eid: DesiredPlacement(eid, tuple(m.spec for m in models)) for eid, models in engines.items()}


async def until_settled(follower: PlacementFollower, desired: dict[str, DesiredPlacement]) -> None:
    """Run passes until the follower waits for a change of the desired state."""
    for _ in range(600):
        if await follower.step(desired) is None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the follower did not settle")


async def test_a_draining_model_finishes_its_requests_refuses_new_ones_then_unloads(
    nodes, llama, qwen2, endless, reference
) -> None:
    a, b = nodes
    want = await expected(b, endless.name, reference)
    follower = PlacementFollower("a", a.executor.host, a.executor.migration)  # wait mode, 30 s
    call = a.stub.Generate(request("r1", endless.name))
    tokens: list[int] = []
    await read(call, tokens, 5)

    desired = placements(a=(llama, qwen2))  # the endless llama leaves the fleet
    assert await follower.step(desired) is not None
    assert endless.name in a.executor.host.models  # still loaded, running its request ...
    assert endless.name not in a.executor.host.serving_model_names()  # ... but no longer advertised
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await read(a.stub.Generate(request("r-new", endless.name)), [])
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "draining" in e.value.details()

    final = await read(call, tokens)
    assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH and final.engine_id == "a"
    assert tokens == want
    await until_settled(follower, desired)
    assert set(a.executor.host.models) == {llama.name, qwen2.name}
    assert a.executor.load_snapshot().kv_blocks_used == 0


async def test_migrate_mode_moves_requests_with_their_kv(nodes, llama, qwen2, endless, reference) -> None:
    a, b = nodes
    want = await expected(b, endless.name, reference)
    fake = FakeNodes()
    fake.advertise(b, llama.name, qwen2.name, endless.name)
    follower = PlacementFollower(
        "a", a.executor.host, a.executor.migration, drain=DrainSettings(mode="migrate"), nodes=fake
    )
    call = a.stub.Generate(request("r2", endless.name))
    tokens: list[int] = []
    await read(call, tokens, 5)

    desired = placements(a=(llama, qwen2), b=(llama, qwen2, endless))
    await follower.step(desired)
    final = await read(call, tokens)
    assert final.finish_reason == common_pb2.FINISH_REASON_MIGRATED and final.migrated_to == b.address
    final = await read(b.stub.Generate(request("r2", endless.name, tokens)), tokens)  # the scheduler's attach
    assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH and final.engine_id == "b"
    assert tokens == want
    await until_settled(follower, desired)
    assert endless.name not in a.executor.host.models


async def test_past_the_timeout_without_a_destination_requests_resume_elsewhere(
    nodes, llama, qwen2, endless, reference
) -> None:
    a, b = nodes
    want = await expected(b, endless.name, reference)
    follower = PlacementFollower(
        "a", a.executor.host, a.executor.migration, drain=DrainSettings(timeout_s=0.0), nodes=FakeNodes()
    )
    call = a.stub.Generate(request("r3", endless.name))
    tokens: list[int] = []
    await read(call, tokens, 5)

    desired = placements(a=(llama, qwen2))
    await follower.step(desired)
    with pytest.raises(grpc.aio.AioRpcError) as e:  # evicted: a retryable status after its tokens
        await read(call, tokens)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "resume on another engine" in e.value.details()
    assert len(tokens) >= 5
    final = await read(
        b.stub.Generate(request("r3", endless.name, list(tokens))), tokens
    )  # the relay's resume
    assert final.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert tokens == want
    await until_settled(follower, desired)
    assert endless.name not in a.executor.host.models


async def test_hand_off_waits_for_the_new_host_and_a_model_desired_again_serves_again(
    nodes, llama, qwen2, endless
) -> None:
    a, b = nodes
    fake = FakeNodes()
    follower = PlacementFollower("a", a.executor.host, a.executor.migration, nodes=fake)
    moved = placements(a=(llama, qwen2), b=(endless,))
    await follower.step(moved)
    assert endless.name in a.executor.host.serving_model_names()  # b does not serve it yet: keep serving
    fake.advertise(b, endless.name)
    await follower.step(moved)
    assert endless.name not in a.executor.host.serving_model_names()  # b serves it: drain here
    await follower.step(placements(a=(llama, qwen2, endless)))  # changed its mind
    assert endless.name in a.executor.host.serving_model_names()
    assert a.executor.host.draining_reason(endless.name) is None


async def test_new_models_load_before_the_old_ones_leave(nodes, llama, qwen2, endless, mistral) -> None:
    a, _ = nodes
    changes: list[tuple[str, ...]] = []
    a.executor.host.on_models_changed.append(changes.append)
    follower = PlacementFollower("a", a.executor.host, a.executor.migration)
    desired = placements(a=(llama, mistral))
    await until_settled(follower, desired)
    assert set(a.executor.host.models) == {llama.name, mistral.name}
    assert {mistral.name, qwen2.name, endless.name} <= set(changes[0])  # loaded while the others stayed
    idle = {"a": DesiredPlacement("a", ())}  # scale-in: everything drains, the engine stays, idle
    await until_settled(follower, idle)
    assert a.executor.host.models == {} and follower.applied == idle["a"]


async def test_a_failed_load_is_retried_every_retry_s_not_every_pass(nodes, llama) -> None:
    a, _ = nodes
    calls: list[str] = []
    load = a.executor.host.load

    def counting(spec):
        calls.append(spec.name)
        return load(spec)

    a.executor.host.load = counting
    follower = PlacementFollower("a", a.executor.host, a.executor.migration, retry_s=60.0)
    bad = ModelSpec("bad", "tiny://nope")
    desired = {"a": DesiredPlacement("a", (llama.spec, bad))}
    for _ in range(5):  # the other models drain and unload meanwhile
        await follower.step(desired)
    assert calls.count("bad") == 1 and set(a.executor.host.models) == {llama.name}
    assert await follower.step(desired) == 60.0  # next try after retry_s
    assert await follower.step({"a": DesiredPlacement("a", (llama.spec,))}) is None  # dropped: done
