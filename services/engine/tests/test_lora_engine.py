"""LoRA adapters through the native executor: a request names an adapter like a model, runs on its base
in the same batches as the base's and other adapters' requests, and its greedy output equals HF
``generate`` on the base with the adapter merged; the adapter pool loads, pins and evicts on demand."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import chunk_checks as cc
import pytest
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.types import ModelSpec
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.lora import AdapterError, pool_bytes
from llmfleet_engine.main import adapter_flag
from llmfleet_engine.models import LoadedModel, load_model
from llmfleet_engine.servicer import EngineServicer, snapshot_to_proto
from llmfleet_engine.validation import GenerationRequest, UnknownModelError, build_request
from lora_checkpoints import fresh_base, hf_greedy, merged, save_checkpoints

BASE = "lora-base"
N = 16
PROMPT = "Once upon a time there was a little town by the river."


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, dict[str, Path]]:
    return save_checkpoints(tmp_path_factory.mktemp("lora-engine"), cache_dir)


@pytest.fixture
def make(checkpoints, cache_dir: Path) -> Iterator:
    """``make(max_loras)``: an executor hosting the base checkpoint with every test adapter added (none
    with LoRA off)."""
    base_dir, dirs = checkpoints
    made: list[Executor] = []

    def build(max_loras: int) -> tuple[Executor, LoadedModel]:
        ex = Executor(
            ExecutorConfig(cache_dir=cache_dir, allow_download=False, max_loras=max_loras, max_lora_rank=8)
        )
        made.append(ex)
        base = load_model(
            ModelSpec(name=BASE, source=str(base_dir)), cache_dir=cache_dir, allow_download=False
        )
        ex.host.add_loaded(base)
        for name, d in dirs.items() if max_loras else ():
            ex.adapters.add(name, BASE, d)
        return ex, base

    yield build
    for ex in made:
        ex.close()


def request(base: LoadedModel, model: str, rid: str, max_tokens: int = N) -> GenerationRequest:
    return dataclasses.replace(
        build_request(base, PROMPT, request_id=rid, max_tokens=max_tokens), model=model
    )


async def test_adapters_and_base_share_batches_each_with_its_own_output(make, checkpoints) -> None:
    base_dir, dirs = checkpoints
    ex, base = make(max_loras=3)
    names = ["qv", BASE, "all", "mlp"]
    reqs = [request(base, n, f"r{i}") for i, n in enumerate(names)]
    streams = [ex.submit(r) for r in reqs]  # submitted together: they run in the same batches
    outs = [cc.ids(await s.collect()) for s in streams]
    want = [
        hf_greedy(fresh_base(base_dir) if n == BASE else merged(base_dir, dirs[n]), r.prompt_token_ids, N)
        for n, r in zip(names, reqs, strict=True)
    ]
    assert outs == want
    assert len({tuple(o) for o in outs}) == 4  # one prompt, four models: the same prefix never shared
    assert sorted(ex.adapters.resident(BASE)) == ["all", "mlp", "qv"]


async def test_the_pool_loads_on_demand_and_evicts_the_least_recently_used(make, checkpoints) -> None:
    base_dir, dirs = checkpoints
    ex, base = make(max_loras=1)
    for i, name in enumerate(["qv", "all", "qv"]):
        got = cc.ids(await ex.submit(request(base, name, f"s{i}")).collect())
        assert got == hf_greedy(merged(base_dir, dirs[name]), request(base, name, "x").prompt_token_ids, N)
        assert ex.adapters.resident(BASE) == [name]
    # the load report says which adapters the base holds and how many were loaded
    (load,) = ex.load_snapshot().models
    assert (load.model, load.adapters, load.adapter_loads, load.adapter_slots) == (BASE, ("qv",), 3, 1)
    (msg,) = snapshot_to_proto(ex.load_snapshot(), "e0").models
    assert (list(msg.adapters), msg.adapter_loads, msg.adapter_slots) == (["qv"], 3, 1)


async def test_more_adapters_than_slots_in_flight_wait_for_a_slot_and_all_complete(make, checkpoints) -> None:
    base_dir, dirs = checkpoints
    ex, base = make(max_loras=1)
    names = ["qv", "all", "mlp", "qv", BASE, "all", "mlp"]
    reqs = [request(base, n, f"w{i}", max_tokens=N) for i, n in enumerate(names)]
    streams = [ex.submit(r) for r in reqs]  # three adapters in flight at once, one slot: none refused
    outs = [await asyncio.wait_for(s.collect(), 60) for s in streams]
    assert all(o[-1].finish_reason.name in ("LENGTH", "EOS", "STOP") for o in outs)
    want = {
        n: hf_greedy(
            fresh_base(base_dir) if n == BASE else merged(base_dir, dirs[n]), reqs[0].prompt_token_ids, N
        )
        for n in set(names)
    }
    # each row read its own adapter's weights: no slot was rewritten under a running request
    assert [cc.ids(o) for o in outs] == [want[n] for n in names]
    (load,) = ex.load_snapshot().models
    assert load.adapter_loads >= 3 and len(load.adapters) == 1
    assert not ex.core.requests and not ex.table.requests


async def test_a_higher_priority_adapter_request_preempts_another_adapters_holder_for_the_slot(
    make, checkpoints
) -> None:
    base_dir, dirs = checkpoints
    ex, base = make(max_loras=1)
    low = ex.submit(request(base, "qv", "low", max_tokens=4 * N))
    first = await low.__anext__()  # running: "qv" holds the only slot
    high = dataclasses.replace(request(base, "all", "high"), priority=1)
    got_high = cc.ids(await asyncio.wait_for(ex.submit(high).collect(), 60))
    rest = await asyncio.wait_for(low.collect(), 60)
    assert ex.preemptions == 1  # the low one, for the slot; it resumed by recompute
    assert got_high == hf_greedy(merged(base_dir, dirs["all"]), high.prompt_token_ids, N)
    want_low = hf_greedy(merged(base_dir, dirs["qv"]), high.prompt_token_ids, 4 * N)
    assert cc.ids([first, *rest]) == want_low
    (load,) = ex.load_snapshot().models
    assert load.adapter_loads == 3  # qv, all for the high one, qv again


async def test_a_request_of_an_adapter_not_served_here_is_refused_naming_it(make) -> None:
    ex, base = make(max_loras=1)
    with pytest.raises(UnknownModelError, match="ghost"):
        ex.submit(request(base, "ghost", "g"))


def test_bad_adapters_are_refused_and_the_engine_keeps_serving(make, checkpoints, tmp_path: Path) -> None:
    _, dirs = checkpoints
    ex, _ = make(max_loras=2)
    with pytest.raises(AdapterError, match=r"adapter_config\.json is missing"):
        ex.adapters.add("ghost", BASE, tmp_path)
    assert ex.adapters.add("x", "nope", dirs["qv"]) is None  # declared: registered once "nope" loads
    with pytest.raises(AdapterError, match="a model of that name is loaded here"):
        ex.adapters.add(BASE, BASE, dirs["qv"])
    off, _ = make(max_loras=0)
    with pytest.raises(AdapterError, match="LoRA is off on this engine"):
        off.adapters.add("y", BASE, dirs["qv"])
    assert ex.adapters.base_of("qv") == BASE and ex.adapters.base_of("ghost") is None
    assert ex.adapters.base_of("x") is None


async def test_declared_adapters_follow_their_base(checkpoints, cache_dir: Path) -> None:
    base_dir, dirs = checkpoints
    ex = Executor(ExecutorConfig(cache_dir=cache_dir, allow_download=False, max_loras=2, max_lora_rank=8))
    try:
        advertised: list[tuple[str, ...]] = []
        ex.host.on_models_changed.append(
            lambda _: advertised.append(ex.adapters.serving(ex.host.serving_model_names()))
        )
        assert ex.adapters.add("qv", BASE, dirs["qv"]) is None and ex.adapters.base_of("qv") is None
        spec = ModelSpec(name=BASE, source=str(base_dir))
        await ex.host.load_async(spec)
        assert ex.adapters.base_of("qv") == BASE and advertised[-1] == (BASE, "qv")
        base = ex.host.models[BASE]
        want = hf_greedy(merged(base_dir, dirs["qv"]), request(base, "qv", "x").prompt_token_ids, N)
        assert cc.ids(await ex.submit(request(base, "qv", "a")).collect()) == want
        await asyncio.to_thread(ex.host.unload, BASE)
        assert ex.adapters.base_of("qv") is None and advertised[-1] == ()
        await ex.host.load_async(spec)  # loaded again: its adapters are registered again
        assert cc.ids(await ex.submit(request(ex.host.models[BASE], "qv", "b")).collect()) == want
        assert ex.adapters.remove("qv") and ex.adapters.base_of("qv") is None
    finally:
        ex.close()


def test_the_adapter_pool_is_reserved_with_the_base(make) -> None:
    on, base = make(max_loras=2)
    off, _ = make(max_loras=0)
    # 2 layers x 2 slots x rank 8 x fp32 x (in + out) of q, k, v, o (64+64, 64+32 x 2, 64+64) and the MLP
    per_layer = (128 + 96 + 96 + 128 + 3 * (64 + 256)) * 2 * 8 * 4
    extra = on.host.reserved_bytes(BASE) - off.host.reserved_bytes(BASE)
    assert extra == pool_bytes(base.model, 2, 8) == 2 * per_layer


@contextlib.asynccontextmanager
async def engine_stub(ex: Executor) -> AsyncIterator[engine_pb2_grpc.EngineStub]:
    """``ex`` served as engine ``e0`` on loopback, and a stub to it."""
    add = engine_pb2_grpc.add_EngineServicer_to_server
    server = await GrpcServer([(add, EngineServicer(ex, "e0"), service_name(engine_pb2, "Engine"))]).start()
    channel = open_channel(server.address)
    try:
        yield engine_pb2_grpc.EngineStub(channel)
    finally:
        await channel.close()
        await server.stop(0)


async def test_a_generate_rpc_names_the_adapter_like_a_model(make, checkpoints) -> None:
    base_dir, dirs = checkpoints
    ex, base = make(max_loras=2)
    async with engine_stub(ex) as stub:
        call = engine_pb2.GenerateRequest(
            model="mlp", prompt=PROMPT, sampling=common_pb2.SamplingParams(max_tokens=N)
        )
        got = [t for c in [c async for c in stub.Generate(call)] for t in c.token_ids]
    assert got == hf_greedy(merged(base_dir, dirs["mlp"]), request(base, "mlp", "x").prompt_token_ids, N)
    # the node record advertises the adapters with their base
    assert ex.adapters.serving(ex.host.serving_model_names()) == ("all", BASE, "mlp", "qv")


def test_the_adapter_flag_reads_name_base_and_directory() -> None:
    assert adapter_flag("chat=base-llama:/adapters/chat") == ("chat", "base-llama", "/adapters/chat")
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=BASE:DIR"):
        adapter_flag("chat=/adapters/chat")
