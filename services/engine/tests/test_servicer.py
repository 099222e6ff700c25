"""The Engine gRPC service end to end, in process: GrpcServer + open_channel + a real executor."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet_engine.executor import Executor
from llmfleet_engine.models import LoadedModel
from llmfleet_engine.servicer import EngineServicer

ENGINE_ID = "engine-test"


@dataclass
class Engine:
    executor: Executor
    stub: engine_pb2_grpc.EngineStub


@pytest.fixture
async def engine(executor: Executor) -> AsyncIterator[Engine]:
    servicer = EngineServicer(executor, ENGINE_ID)
    server = await GrpcServer(
        [(engine_pb2_grpc.add_EngineServicer_to_server, servicer, service_name(engine_pb2, "Engine"))]
    ).start()
    channel = open_channel(server.address)
    try:
        yield Engine(executor, engine_pb2_grpc.EngineStub(channel))
    finally:
        await channel.close()
        await server.stop(0)


def _generate(model: str, prompt: str, **sampling: object) -> engine_pb2.GenerateRequest:
    return engine_pb2.GenerateRequest(
        request_id="", model=model, prompt=prompt, sampling=common_pb2.SamplingParams(**sampling)
    )


async def _wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_generate_streams_greedy_tokens(
    engine: Engine, llama: LoadedModel, hf_greedy, long_prompt
) -> None:
    prompt = long_prompt(llama, 16)
    expected = hf_greedy(llama, llama.tokenizer(prompt)["input_ids"], 16)
    chunks = [c async for c in engine.stub.Generate(_generate(llama.name, prompt, max_tokens=16))]
    assert len(chunks) == 16
    assert [c.index for c in chunks] == list(range(16))
    assert [t for c in chunks for t in c.token_ids] == expected
    assert {c.engine_id for c in chunks} == {ENGINE_ID}
    assert len({c.request_id for c in chunks}) == 1 and len(chunks[0].request_id) == 32
    last = chunks[-1]
    assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert last.HasField("usage") and last.usage.completion_tokens == 16
    assert last.usage.prompt_tokens == len(llama.tokenizer(prompt)["input_ids"])
    assert not any(c.HasField("usage") or c.finish_reason for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == llama.tokenizer.decode(expected)


@pytest.mark.parametrize(
    ("model", "prompt", "sampling", "code", "needle"),
    [
        ("tiny-llama", "", {}, grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
        ("tiny-llama", "hi", {"max_tokens": 0}, grpc.StatusCode.INVALID_ARGUMENT, "sampling.max_tokens"),
        ("tiny-llama", "hi", {"max_tokens": 4096}, grpc.StatusCode.INVALID_ARGUMENT, "2048"),
        ("tiny-llama", "hi", {"temperature": -1.0}, grpc.StatusCode.INVALID_ARGUMENT, "sampling.temperature"),
        ("tiny-llama", "hi", {"top_p": 0.0}, grpc.StatusCode.INVALID_ARGUMENT, "sampling.top_p"),
        ("tiny-llama", "hi", {"top_p": 1.5}, grpc.StatusCode.INVALID_ARGUMENT, "sampling.top_p"),
        ("no-such-model", "hi", {}, grpc.StatusCode.NOT_FOUND, "no-such-model"),
    ],
)
async def test_generate_rejects_invalid(
    engine: Engine, model: str, prompt: str, sampling: dict, code: grpc.StatusCode, needle: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in engine.stub.Generate(_generate(model, prompt, **sampling)):
            pass
    assert info.value.code() == code
    assert needle in info.value.details()


async def test_client_cancel_frees_engine_work(engine: Engine, endless: LoadedModel) -> None:
    call = engine.stub.Generate(_generate(endless.name, "The quick brown fox", max_tokens=1500))
    seen = 0
    async for _ in call:
        seen += 1
        if seen == 3:
            break
    assert engine.executor.load_snapshot().running == 1
    call.cancel()
    await _wait_for(lambda: engine.executor.load_snapshot().running == 0)
    assert engine.executor.load_snapshot().kv_used_bytes == 0


class _HeldTokenizer:
    """``tokenizer`` that, for a prompt containing ``word``, waits (at most 5 s) until ``release`` is set."""

    def __init__(self, tokenizer: Any, word: str) -> None:
        self._tokenizer, self._word = tokenizer, word
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, text: str, **kwargs: Any) -> Any:
        if self._word in text:
            self.entered.set()
            self.release.wait(5.0)
        return self._tokenizer(text, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


async def test_a_prompt_being_tokenized_holds_up_no_other_stream(
    engine: Engine, endless: LoadedModel
) -> None:
    """Prompts are tokenized off the event loop: while one request's tokenizer runs, another request
    on the engine streams to its end."""
    tokenizer = _HeldTokenizer(endless.tokenizer, "HOLD")
    engine.executor.host.add_loaded(dataclasses.replace(endless, name="tiny-llama-held", tokenizer=tokenizer))

    async def run(prompt: str, n: int) -> list[common_pb2.TokenChunk]:
        return [c async for c in engine.stub.Generate(_generate("tiny-llama-held", prompt, max_tokens=n))]

    held = asyncio.ensure_future(run("HOLD the quick brown fox", 4))
    await _wait_for(tokenizer.entered.is_set)
    other = await run("The quick brown fox", 8)
    assert len(other) == 8 and other[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert not held.done()  # still in its tokenizer
    tokenizer.release.set()
    assert len(await held) == 4


async def test_ttft_counts_from_receipt_before_tokenizing(engine: Engine, endless: LoadedModel) -> None:
    """A request's TTFT and latency count from the engine's receipt, before its prompt is tokenized (as
    vLLM counts from its arrival time); its queue time from the executor's arrival, after it."""
    tokenizer = _HeldTokenizer(endless.tokenizer, "HOLD")
    engine.executor.host.add_loaded(dataclasses.replace(endless, name="tiny-llama-held", tokenizer=tokenizer))
    call = engine.stub.Generate(_generate("tiny-llama-held", "HOLD the quick brown fox", max_tokens=2))
    chunks = asyncio.ensure_future(_collect(call))
    await _wait_for(tokenizer.entered.is_set)
    await asyncio.sleep(0.3)
    tokenizer.release.set()
    usage = (await chunks)[-1].usage
    assert usage.ttft_s - usage.queue_s >= 0.3 and usage.latency_s >= usage.ttft_s


async def _collect(call: Any) -> list[common_pb2.TokenChunk]:
    return [c async for c in call]


async def test_cancel_rpc(engine: Engine, endless: LoadedModel) -> None:
    request = _generate(endless.name, "The quick brown fox", max_tokens=1500)
    request.request_id = "to-cancel"
    call = engine.stub.Generate(request)
    first = await call.read()
    assert first.request_id == "to-cancel"
    assert (await engine.stub.Cancel(common_pb2.CancelRequest(request_id="to-cancel"))).found
    chunks = [first]
    while (chunk := await call.read()) is not grpc.aio.EOF:
        chunks.append(chunk)
    assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_CANCELLED
    assert not (await engine.stub.Cancel(common_pb2.CancelRequest(request_id="to-cancel"))).found


async def test_load_unload_and_info(engine: Engine, cache_dir) -> None:
    spec = engine_pb2.ModelSpec(name="tiny-mistral", source="tiny://mistral")
    loaded = await engine.stub.LoadModel(engine_pb2.LoadModelRequest(model=spec))
    assert loaded.model == "tiny-mistral" and loaded.weight_bytes > 0 and loaded.max_context == 2048
    again = await engine.stub.LoadModel(engine_pb2.LoadModelRequest(model=spec))  # idempotent
    assert again.weight_bytes == loaded.weight_bytes

    info = await engine.stub.GetInfo(engine_pb2.GetInfoRequest())
    assert info.engine_id == ENGINE_ID and info.device == "cpu" and info.backend == "native"
    assert info.memory_bytes > 0 and info.kv_capacity_bytes > 0
    by_name = {m.name: m for m in info.models}
    assert sorted(by_name) == ["tiny-llama", "tiny-llama-endless", "tiny-mistral", "tiny-qwen2"]
    assert by_name["tiny-mistral"].architecture == "MistralForCausalLM"
    assert by_name["tiny-mistral"].kv_bytes_per_token > 0

    chunks = [c async for c in engine.stub.Generate(_generate("tiny-mistral", "Hello", max_tokens=3))]
    assert chunks[-1].finish_reason in (common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_EOS)

    assert (await engine.stub.UnloadModel(engine_pb2.UnloadModelRequest(model="tiny-mistral"))).unloaded
    info = await engine.stub.GetInfo(engine_pb2.GetInfoRequest())
    assert "tiny-mistral" not in {m.name for m in info.models}


@pytest.mark.parametrize(
    ("spec", "code", "needle"),
    [
        ({"name": "x", "source": "tiny://gpt9"}, grpc.StatusCode.NOT_FOUND, "gpt9"),
        ({"name": "x", "source": "/no/such/checkpoint"}, grpc.StatusCode.NOT_FOUND, "/no/such/checkpoint"),
        ({"name": "x", "source": "tiny://llama", "dtype": "int3"}, grpc.StatusCode.INVALID_ARGUMENT, "int3"),
        ({"name": "", "source": "tiny://llama"}, grpc.StatusCode.INVALID_ARGUMENT, "model.name"),
        ({"name": "x", "source": ""}, grpc.StatusCode.INVALID_ARGUMENT, "model.source"),
        ({"name": "tiny-llama", "source": "tiny://qwen2"}, grpc.StatusCode.ALREADY_EXISTS, "tiny-llama"),
    ],
)
async def test_load_model_errors(engine: Engine, spec: dict, code: grpc.StatusCode, needle: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await engine.stub.LoadModel(engine_pb2.LoadModelRequest(model=engine_pb2.ModelSpec(**spec)))
    assert info.value.code() == code
    assert needle in info.value.details()


async def test_unload_unknown_model(engine: Engine) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await engine.stub.UnloadModel(engine_pb2.UnloadModelRequest(model="ghost"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "ghost" in info.value.details()


async def test_watch_load_streams_snapshots(engine: Engine, endless: LoadedModel) -> None:
    call = engine.stub.Generate(_generate(endless.name, "The quick brown fox", max_tokens=1500))
    await call.read()
    watch = engine.stub.WatchLoad(engine_pb2.WatchLoadRequest(interval_s=0.05))
    snaps = []
    async for snap in watch:
        snaps.append(snap)
        if len(snaps) == 3:
            break
    watch.cancel()
    call.cancel()
    assert all(s.engine_id == ENGINE_ID for s in snaps)
    assert snaps[0].timestamp < snaps[-1].timestamp
    assert snaps[-1].running == 1 and snaps[-1].kv_used_bytes > 0
    model_load = next(m for m in snaps[-1].models if m.model == endless.name)
    assert model_load.running == 1
    assert model_load.kv_used_bytes == model_load.kv_tokens * endless.kv_bytes_per_token
    assert snaps[-1].kv_capacity_bytes == engine.executor.host.kv_capacity_bytes
