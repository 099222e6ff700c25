"""The vLLM backend adapter's executor machinery.

Without vLLM (this machine): the module imports, the executor refuses to start with the install hint,
and the executor (threads, streaming, cancel, unload, snapshot) runs against a *fake* ``vllm`` package
whose engine decodes greedily with the tiny HF model on the CPU (``vllm_doubles``; the pure mappings
are in test_vllm_mappings.py). The last test runs the real vLLM on a GPU host and is skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import importlib.util

import chunk_checks as cc
import pytest
import torch
from llmfleet.api.v1 import engine_pb2
from llmfleet.types import ModelSpec
from llmfleet_engine import vllm_backend as vb
from llmfleet_engine import vllm_models as vmodels
from llmfleet_engine.models import LoadedModel, ModelLoadError, load_model
from llmfleet_engine.outputs import (
    DuplicateRequestError,
    ExecutorClosedError,
    FinishReason,
    ModelConflictError,
)
from llmfleet_engine.validation import UnknownModelError, build_request, validate_generate
from vllm_doubles import (
    LLAMA,
    QWEN2,
    FakeAsyncLLMEngine,
    FakeCompletionOutput,
    FakeRequestOutput,
    _eid,
)

# ------------------------------------------------------------------ the executor on a fake vLLM


def test_load_reports_model_facts(vexec: vb.VllmExecutor, llama: LoadedModel) -> None:
    model = vexec.models["tiny-llama"]
    assert isinstance(model, vb.VllmLoadedModel) and isinstance(model, LoadedModel)
    engine = FakeAsyncLLMEngine.instances[-1]
    assert model.model is engine and model.path == llama.path
    assert engine.args.model == llama.path and engine.args.dtype == "auto"  # spec float32 = unspecified
    assert engine.args.gpu_memory_utilization == pytest.approx(0.85 / 2)
    assert (model.dtype, model.engine_dtype, model.memory_fraction) == (
        "float32",
        "float32",
        pytest.approx(0.425),
    )
    assert model.max_context == 2048 and model.vocab_size == llama.vocab_size
    assert model.eos_token_ids == llama.eos_token_ids
    assert model.weight_bytes == llama.weight_bytes and model.kv_bytes_per_token == llama.kv_bytes_per_token
    assert model.architecture == llama.architecture and model.spec == LLAMA
    assert vexec.kv_capacity_bytes == 100 * 16 * llama.kv_bytes_per_token
    assert vexec.backend == "vllm" and vexec.device == "cuda" and not vexec.supports_kv_transfer


def test_load_idempotent_conflict_limit_reconcile(make_vllm_executor) -> None:
    executor = make_vllm_executor(max_models=2, max_model_len=256)
    changes: list[tuple[str, ...]] = []
    executor.on_models_changed.append(changes.append)
    assert not executor.load(LLAMA).already_loaded
    assert executor.load(LLAMA).already_loaded
    assert executor.models["tiny-llama"].max_context == 256
    with pytest.raises(ModelConflictError):
        executor.load(ModelSpec(name="tiny-llama", source="tiny://qwen2"))
    executor.load(QWEN2)
    with pytest.raises(ModelLoadError, match="max_models=2"):
        executor.load(ModelSpec(name="third", source="tiny://mistral"))
    result = executor.reconcile([QWEN2, ModelSpec(name="other", source="/no/such/dir")])
    assert result.unloaded == ["tiny-llama"] and result.loaded == [] and "other" in result.errors
    assert executor.model_names() == ("tiny-qwen2",)
    assert changes == [("tiny-llama",), ("tiny-llama", "tiny-qwen2"), ("tiny-qwen2",)]
    assert FakeAsyncLLMEngine.instances[0].shutdown_calls == 1


async def test_greedy_matches_hf_through_the_adapter(
    vexec: vb.VllmExecutor, llama: LoadedModel, prompts, hf_greedy
) -> None:
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]
    n = 16
    for i, prompt in enumerate(prompts[:4]):
        req = build_request(model, prompt, max_tokens=n, request_id=f"g{i}")
        assert req.prompt_token_ids == tuple(llama.tokenizer(prompt)["input_ids"])
        expected = hf_greedy(llama, req.prompt_token_ids, n)
        chunks = await vexec.submit(req).collect()
        cc.check_stream(chunks)
        assert cc.ids(chunks) == expected
        assert chunks[-1].finish_reason == (FinishReason.LENGTH if len(expected) == n else FinishReason.EOS)
        assert cc.text(chunks) == llama.tokenizer.decode(expected, skip_special_tokens=True)
        usage = chunks[-1].usage
        assert usage.prompt_tokens == len(req.prompt_token_ids)
        assert 0 <= usage.queue_s <= usage.ttft_s <= usage.latency_s
        params = engine.params[_eid(engine, f"g{i}")]
        assert (params.temperature, params.top_p, params.max_tokens, params.detokenize) == (
            0.0,
            1.0,
            n,
            False,
        )
        assert engine.prompts[_eid(engine, f"g{i}")] == list(req.prompt_token_ids)


async def test_validate_generate_works_unchanged(vexec: vb.VllmExecutor) -> None:
    proto = engine_pb2.GenerateRequest(model="tiny-llama", prompt="The quick brown fox", request_id="p1")
    proto.sampling.max_tokens = 4
    req = validate_generate(proto, vexec.models)
    chunks = await vexec.submit(req).collect()
    cc.check_stream(chunks)
    assert chunks[-1].usage.completion_tokens <= 4


async def test_concurrent_requests_across_models(
    make_vllm_executor, llama, qwen2, prompts, hf_greedy
) -> None:
    executor = make_vllm_executor()
    executor.load(LLAMA)
    executor.load(QWEN2)
    pairs = [
        (hf, build_request(executor.models[hf.name], p, max_tokens=12))
        for hf in (llama, qwen2)
        for p in prompts[:3]
    ]
    results = await asyncio.gather(*(executor.submit(r).collect() for _, r in pairs))
    for (hf, req), chunks in zip(pairs, results, strict=True):
        cc.check_stream(chunks)
        assert cc.ids(chunks) == hf_greedy(hf, req.prompt_token_ids, 12)


async def test_resume_re_prefills_and_continues(
    vexec: vb.VllmExecutor, llama: LoadedModel, long_prompt
) -> None:
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]
    n = 12
    prompt = long_prompt(llama, n)
    full = await vexec.submit(build_request(model, prompt, max_tokens=n)).collect()
    ids = cc.ids(full)
    for k in (1, 5, n - 1):
        req = build_request(model, prompt, max_tokens=n, resume_token_ids=ids[:k], request_id=f"res{k}")
        resumed = await vexec.submit(req).collect()
        cc.check_stream(resumed, start=k)
        assert cc.ids(resumed) == ids[k:]
        assert resumed[-1].finish_reason == FinishReason.LENGTH and resumed[-1].usage.completion_tokens == n
        assert "".join(c.text for c in full[:k]) + cc.text(resumed) == cc.text(full)
        assert engine.prompts[_eid(engine, f"res{k}")] == [*req.prompt_token_ids, *ids[:k]]  # token transfer
        assert engine.params[_eid(engine, f"res{k}")].max_tokens == n - k
    done = await vexec.submit(
        build_request(model, prompt, max_tokens=3, resume_token_ids=ids[:3], request_id="done")
    ).collect()
    assert len(done) == 1 and done[0].finish_reason == FinishReason.LENGTH and done[0].index == 3
    assert not any(k.startswith("done.") for k in engine.prompts)  # never reached vLLM


async def test_stop_string_ends_and_aborts_engine(
    vexec: vb.VllmExecutor, llama: LoadedModel, long_prompt
) -> None:
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]
    n = 24
    prompt = long_prompt(llama, n)
    full = await vexec.submit(build_request(model, prompt, max_tokens=n)).collect()
    text = cc.text(full)
    start = next(
        i
        for i in range(4, len(text) - 3)
        if "\ufffd" not in text[i : i + 3] and text.find(text[i : i + 3]) == i
    )
    stop = text[start : start + 3]
    req = build_request(model, prompt, max_tokens=n, stop=[stop], request_id="stopper")
    chunks = await vexec.submit(req).collect()
    cc.check_stream(chunks)
    assert chunks[-1].finish_reason == FinishReason.STOP and cc.text(chunks) == text[:start]
    assert cc.ids(chunks) == cc.ids(full)[: len(cc.ids(chunks))] and len(cc.ids(chunks)) < n
    params = engine.params[_eid(engine, "stopper")]
    assert params.stop == [stop] and params.detokenize
    await cc.wait_for(lambda: _eid(engine, "stopper") in engine.aborted)


async def test_cancel_and_closing_streams(vexec: vb.VllmExecutor, llama: LoadedModel, long_prompt) -> None:
    FakeAsyncLLMEngine.step_delay_s = 0.05
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]
    prompt = long_prompt(llama, 30)
    req = build_request(model, prompt, max_tokens=30, request_id="long")
    stream = vexec.submit(req)
    first = await stream.__anext__()
    assert not first.final
    snap = vexec.load_snapshot()
    assert (snap.running, snap.waiting) == (1, 0)
    (load,) = snap.models
    assert load.kv_tokens >= req.prompt_tokens + 1
    assert load.kv_used_bytes == load.kv_tokens * model.kv_bytes_per_token
    assert list(snap.requests.rows()) == [
        ("long", "tiny-llama", load.kv_tokens, load.kv_used_bytes, "decode")
    ]
    with pytest.raises(DuplicateRequestError):
        vexec.submit(build_request(model, prompt, max_tokens=5, request_id="long"))
    assert vexec.cancel("long")
    assert not vexec.cancel("long")
    rest = [c async for c in stream]
    assert rest[-1].finish_reason == FinishReason.CANCELLED and rest[-1].usage is not None
    cc.check_stream([first, *rest])
    await cc.wait_for(lambda: any(k.startswith("long.") for k in engine.aborted))
    snap = vexec.load_snapshot()
    assert (snap.running, snap.waiting, snap.kv_used_bytes) == (0, 0, 0)
    FakeAsyncLLMEngine.step_delay_s = 0.0  # the same id again right away: a fresh engine-side id
    again = await vexec.submit(build_request(model, prompt, max_tokens=3, request_id="long")).collect()
    assert again[-1].finish_reason == FinishReason.LENGTH and len(cc.ids(again)) == 3
    assert len([k for k in engine.prompts if k.startswith("long.")]) == 2
    FakeAsyncLLMEngine.step_delay_s = 0.05

    stream = vexec.submit(build_request(model, prompt, max_tokens=30, request_id="closed"))
    await stream.__anext__()
    await stream.aclose()
    assert vexec.load_snapshot().running == 0
    await cc.wait_for(lambda: _eid(engine, "closed") in engine.aborted)

    stream = vexec.submit(build_request(model, prompt, max_tokens=30, request_id="reader"))
    reader = asyncio.create_task(stream.collect())
    await cc.wait_for(lambda: vexec.load_snapshot().running == 1)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert vexec.load_snapshot().running == 0
    await cc.wait_for(lambda: _eid(engine, "reader") in engine.aborted)


async def test_unload_cancels_requests_and_shuts_engine_down(
    vexec: vb.VllmExecutor, llama: LoadedModel, long_prompt
) -> None:
    FakeAsyncLLMEngine.step_delay_s = 0.05
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]
    stream = vexec.submit(build_request(model, long_prompt(llama, 30), max_tokens=30, request_id="u1"))
    await stream.__anext__()
    assert await asyncio.to_thread(vexec.unload, "tiny-llama")
    rest = [c async for c in stream]
    assert rest[-1].finish_reason == FinishReason.CANCELLED
    assert engine.shutdown_calls == 1 and _eid(engine, "u1") in engine.aborted
    assert vexec.model_names() == () and vexec.kv_capacity_bytes == 0
    assert not vexec.unload("tiny-llama")
    with pytest.raises(UnknownModelError):
        vexec.submit(build_request(model, "hi", max_tokens=2))


async def test_snapshot_throughput_and_close(vexec: vb.VllmExecutor) -> None:
    model = vexec.models["tiny-llama"]
    chunks = await vexec.submit(build_request(model, "The quick brown fox", max_tokens=8)).collect()
    snap = vexec.load_snapshot()
    assert snap.tokens_per_s == pytest.approx(len(cc.ids(chunks)) / vexec.config.throughput_window_s)
    assert snap.kv_capacity_bytes == vexec.kv_capacity_bytes > 0
    await vexec.aclose()
    assert FakeAsyncLLMEngine.instances[-1].shutdown_calls == 1
    with pytest.raises(ExecutorClosedError):
        vexec.submit(build_request(model, "hi", max_tokens=2))
    with pytest.raises(ExecutorClosedError):
        vexec.load(LLAMA)


async def test_engine_errors_end_the_stream_with_error(vexec: vb.VllmExecutor, monkeypatch) -> None:
    model = vexec.models["tiny-llama"]
    engine = FakeAsyncLLMEngine.instances[-1]

    async def broken(prompt, sampling_params, request_id):
        raise RuntimeError("engine dead")
        yield  # an async generator, like vLLM's generate

    async def silent(prompt, sampling_params, request_id):  # ends without a finished output
        yield FakeRequestOutput(request_id, [FakeCompletionOutput(0, "", [42])], False)

    for generate in (broken, silent):
        monkeypatch.setattr(engine, "generate", generate)
        chunks = await vexec.submit(build_request(model, "The quick brown fox", max_tokens=8)).collect()
        assert chunks[-1].finish_reason == FinishReason.ERROR and chunks[-1].usage is not None
        cc.check_stream(chunks)
    assert vexec.load_snapshot().running == 0


def test_engine_start_failure_is_a_load_error(make_vllm_executor, monkeypatch) -> None:
    def fail(args):
        raise RuntimeError("CUDA out of memory")

    executor = make_vllm_executor()
    with monkeypatch.context() as patch:
        patch.setattr(FakeAsyncLLMEngine, "from_engine_args", staticmethod(fail))
        with pytest.raises(
            ModelLoadError, match="vLLM could not start 'tiny://llama': RuntimeError: CUDA out of memory"
        ):
            executor.load(LLAMA)
    assert executor.model_names() == () and not FakeAsyncLLMEngine.instances

    def broken(config, dtype):
        raise RuntimeError("odd config")

    monkeypatch.setattr(vmodels, "_kv_bytes_per_token", broken)  # fails after the engine started
    with pytest.raises(
        ModelLoadError, match="cannot describe model 'tiny://llama': RuntimeError: odd config"
    ):
        executor.load(LLAMA)
    assert executor.model_names() == () and FakeAsyncLLMEngine.instances[-1].shutdown_calls == 1


async def test_servicer_over_the_vllm_executor(vexec: vb.VllmExecutor, llama: LoadedModel, hf_greedy) -> None:
    """The Engine gRPC service runs unchanged on this backend; KV transfer answers FAILED_PRECONDITION."""
    import grpc
    from llmfleet.api.v1 import common_pb2, engine_pb2_grpc
    from llmfleet.rpc.channels import open_channel
    from llmfleet.rpc.server import GrpcServer, service_name
    from llmfleet_engine.servicer import EngineServicer

    servicer = EngineServicer(vexec, "vllm-engine")
    server = await GrpcServer(
        [(engine_pb2_grpc.add_EngineServicer_to_server, servicer, service_name(engine_pb2, "Engine"))]
    ).start()
    channel = open_channel(server.address)
    try:
        stub = engine_pb2_grpc.EngineStub(channel)
        prompt = "The quick brown fox"
        request = engine_pb2.GenerateRequest(
            model="tiny-llama", prompt=prompt, sampling=common_pb2.SamplingParams(max_tokens=8)
        )
        chunks = [c async for c in stub.Generate(request)]
        assert [t for c in chunks for t in c.token_ids] == hf_greedy(
            llama, llama.tokenizer(prompt)["input_ids"], 8
        )
        assert chunks[-1].finish_reason in (common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_EOS)
        info = await stub.GetInfo(engine_pb2.GetInfoRequest())
        assert info.backend == "vllm" and [m.name for m in info.models] == ["tiny-llama"]
        assert info.kv_capacity_bytes == vexec.kv_capacity_bytes
        snapshots = stub.WatchLoad(engine_pb2.WatchLoadRequest(interval_s=0.05))
        snapshot = await snapshots.read()
        snapshots.cancel()
        assert [m.model for m in snapshot.models] == ["tiny-llama"]
        with pytest.raises(grpc.aio.AioRpcError) as info_:
            async for _ in stub.ExportKv(engine_pb2.ExportKvRequest(request_id="x")):
                pass
        assert info_.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "re-prefill" in info_.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as info_:
            await stub.Migrate(engine_pb2.MigrateRequest(request_id="x", destination="localhost:1"))
        assert info_.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert info.max_migrations == 0
    finally:
        await channel.close()
        await server.stop(0)
    assert vexec.attach("anything") is None and not vexec.cancel_if_unattached("anything")


# ------------------------------------------------------------------ the real vLLM (GPU hosts only)

_REAL_VLLM = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


@pytest.mark.skipif(not _REAL_VLLM, reason="needs vllm installed and a CUDA GPU")
async def test_real_vllm_tiny_model_end_to_end(cache_dir, prompts, hf_greedy) -> None:
    """Greedy output through a real vLLM engine equals HF generate (float32 on both sides), resume
    continues the same tokens, cancel and unload work. tiny://mistral has head_dim 32, a size vLLM's
    attention kernels support (the tiny llama's 16 may not be)."""
    spec = ModelSpec(name="tiny-mistral", source="tiny://mistral")
    reference = load_model(spec, cache_dir=cache_dir)
    executor = vb.VllmExecutor(
        vb.VllmConfig(
            cache_dir=cache_dir,
            dtype="float32",
            gpu_memory_utilization=0.3,
            max_models=1,
            enforce_eager=True,
            max_model_len=1024,
            allow_download=False,
        )
    )
    try:
        await asyncio.to_thread(executor.load, spec)
        model = executor.models["tiny-mistral"]
        assert model.max_context == 1024 and model.engine_dtype == "float32"
        n = 16
        for prompt in prompts[:4]:
            req = build_request(model, prompt, max_tokens=n)
            expected = hf_greedy(reference, req.prompt_token_ids, n)
            chunks = await executor.submit(req).collect()
            cc.check_stream(chunks)
            assert cc.ids(chunks) == expected
            assert cc.text(chunks) == reference.tokenizer.decode(expected, skip_special_tokens=True)
            if len(expected) == n and n > 4:
                resumed = await executor.submit(
                    build_request(model, prompt, max_tokens=n, resume_token_ids=expected[:4])
                ).collect()
                cc.check_stream(resumed, start=4)
                assert cc.ids(resumed) == expected[4:]
        stream = executor.submit(build_request(model, prompts[0], max_tokens=900, request_id="cancel-me"))
        await stream.__anext__()
        assert executor.cancel("cancel-me")
        assert (await stream.collect())[-1].finish_reason == FinishReason.CANCELLED
        assert executor.load_snapshot().running == 0
        assert await asyncio.to_thread(executor.unload, "tiny-mistral")
    finally:
        await executor.aclose()


async def test_vllm_metrics_from_the_adapter(vexec: vb.VllmExecutor, llama: LoadedModel, long_prompt) -> None:
    from llmfleet.metrics.engine import EngineMetrics
    from llmfleet.metrics.server import samples
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    vexec.attach_metrics(EngineMetrics(registry))
    model = vexec.models["tiny-llama"]
    req = build_request(model, "The quick brown fox", max_tokens=5, request_id="m1")
    chunks = await vexec.submit(req).collect()
    n = len(cc.ids(chunks))
    s = samples(registry)
    m = 'model_name="tiny-llama"'
    reason = "length" if chunks[-1].finish_reason == FinishReason.LENGTH else "stop"
    assert s[f'vllm:request_success_total{{finished_reason="{reason}",{m}}}'] == 1
    assert s[f"vllm:prompt_tokens_total{{{m}}}"] == req.prompt_tokens
    assert s[f"vllm:generation_tokens_total{{{m}}}"] == n
    assert s[f"vllm:time_to_first_token_seconds_count{{{m}}}"] == 1
    assert s[f"vllm:e2e_request_latency_seconds_count{{{m}}}"] == 1
    assert s[f"vllm:request_queue_time_seconds_count{{{m}}}"] == 1
    assert 1 <= s[f"vllm:inter_token_latency_seconds_count{{{m}}}"] <= n - 1
    FakeAsyncLLMEngine.step_delay_s = 0.05
    stream = vexec.submit(build_request(model, long_prompt(llama, 30), max_tokens=30, request_id="m2"))
    await stream.__anext__()
    assert samples(registry)[f"vllm:num_requests_running{{{m}}}"] == 1
    assert vexec.cancel("m2")
    _ = [c async for c in stream]
    assert samples(registry)[f'vllm:request_success_total{{finished_reason="abort",{m}}}'] == 1
