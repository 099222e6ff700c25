"""The vLLM backend on the real vLLM: vLLM's CPU build here (``make setup-vllm``), CUDA under
``make gpu-check`` (``LLMFLEET_VLLM_DEVICE``).

One executor for the module (a vLLM start costs about a minute on 2 cores) serving a tiny random
Mistral (vLLM's CPU attention needs a head size that is a multiple of 32) in float32, so its greedy
tokens equal HF ``generate``'s on the same checkpoint. Covered: what a load reports (vLLM's context,
dtype and KV blocks), greedy output, concurrent and seeded requests, resume by re-prefill, stop
strings, cancel, the load snapshot and metrics from vLLM's scheduler stats, prefix-cache hits, the
context limit, the gRPC servicer, and a second model loaded and unloaded beside the first (the one
further vLLM start). The pure mappings are in test_vllm_mappings.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import chunk_checks as cc
import grpc
import pytest
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.load.monitor import report_from_proto
from llmfleet.metrics.engine import EngineMetrics
from llmfleet.metrics.server import samples
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.spec.vllm import VllmSettings
from llmfleet.types import ModelSpec
from llmfleet_engine.models import LoadedModel, ModelLoadError, load_model
from llmfleet_engine.outputs import DuplicateRequestError, FinishReason, ModelConflictError
from llmfleet_engine.servicer import EngineServicer, snapshot_to_proto
from llmfleet_engine.validation import UnknownModelError, ValidationError, build_request
from llmfleet_engine.vllm_backend import VllmConfig, VllmExecutor, VllmLoadedModel
from llmfleet_engine.vllm_stats import SchedulerView
from prometheus_client import CollectorRegistry
from vllm_marks import VLLM_DEVICE, VLLM_TINY_SOURCE, requires_vllm

# a vLLM start on a busy 2-core machine takes minutes; the module's first test pays for it
pytestmark = [*requires_vllm, pytest.mark.timeout(600)]

NAME = "tiny-mistral"
SPEC = ModelSpec(name=NAME, source=VLLM_TINY_SOURCE)
SECOND = ModelSpec(name="tiny-mistral-b", source=VLLM_TINY_SOURCE)
MAX_MODEL_LEN = 512
KV_CACHE_BYTES = 256 * 2**20
SETTINGS = VllmSettings(
    kv_cache_memory_bytes=KV_CACHE_BYTES,
    max_model_len=MAX_MODEL_LEN,
    enforce_eager=True,
    dtype="float32",
    max_models=2,  # the module's model and, in the last test, a second one
)
WAIT_S = 60.0  # vLLM's stats reach the adapter after its next step; bounded waits, not timings


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-models")


@pytest.fixture(scope="module")
def reference(models_dir: Path) -> LoadedModel:
    """The same checkpoint through transformers (float32 on the CPU): the greedy reference."""
    return load_model(ModelSpec(name="reference", source=VLLM_TINY_SOURCE), cache_dir=models_dir)


@pytest.fixture(scope="module")
def vexec(models_dir: Path) -> Iterator[VllmExecutor]:
    config = VllmConfig(settings=SETTINGS, device=VLLM_DEVICE, cache_dir=models_dir, allow_download=False)
    executor = VllmExecutor(config)
    executor.attach_metrics(EngineMetrics(CollectorRegistry()))
    try:
        executor.load(SPEC)
        yield executor
    finally:
        executor.close()


@pytest.fixture
def model(vexec: VllmExecutor) -> VllmLoadedModel:
    loaded = vexec.models[NAME]
    assert isinstance(loaded, VllmLoadedModel)
    return loaded


def metric(vexec: VllmExecutor, name: str, model: str = NAME, **labels: str) -> float:
    """One ``vllm:*`` sample of the executor's metrics (0 when not exported yet)."""
    assert vexec.metrics is not None
    parts = [f'{k}="{v}"' for k, v in labels.items()] + [f'model_name="{model}"']
    return samples(vexec.metrics.registry).get(f"{name}{{{','.join(parts)}}}", 0.0)


def scheduler_view(vexec: VllmExecutor, name: str = NAME) -> SchedulerView:
    """vLLM's last scheduler numbers for ``name``, as the stat logger received them."""
    return vexec.scheduler_view(name)


def block_size(model: VllmLoadedModel) -> int:
    return int(model.model.vllm_config.cache_config.block_size)


def words(word: str, n: int) -> str:
    """A prompt of exactly ``n`` tokens on the tiny tokenizer (BOS, then one token per word)."""
    return " ".join([word] * (n - 1))


# ------------------------------------------------------------------ load


def test_load_reports_vllm_facts(vexec: VllmExecutor, model: VllmLoadedModel, reference: LoadedModel) -> None:
    cache = model.model.vllm_config.cache_config
    blocks, size = int(cache.num_gpu_blocks), int(cache.block_size)
    assert blocks > 0 and size > 0
    assert model.max_context == MAX_MODEL_LEN == model.model.model_config.max_model_len
    assert (model.dtype, model.engine_dtype) == ("float32", "float32")
    assert model.kv_bytes_per_token == reference.kv_bytes_per_token > 0
    # vLLM's blocks but its null block
    assert vexec.kv_capacity_bytes == (blocks - 1) * size * reference.kv_bytes_per_token
    # vLLM sized its cache from kv_cache_memory_bytes
    assert KV_CACHE_BYTES // 2 <= vexec.kv_capacity_bytes <= KV_CACHE_BYTES
    assert vexec.model_names() == (NAME,) and list(vexec.models) == [NAME]
    assert model.eos_token_ids == reference.eos_token_ids and model.vocab_size == reference.vocab_size
    assert model.architecture == reference.architecture == "MistralForCausalLM"
    assert model.weight_bytes == reference.weight_bytes > 0
    assert model.source == VLLM_TINY_SOURCE and model.device == VLLM_DEVICE and model.load_s > 0
    assert (vexec.backend, vexec.device, vexec.migration, vexec.host) == ("vllm", VLLM_DEVICE, None, vexec)
    assert vexec.memory_bytes > 0
    snap = vexec.load_snapshot()
    assert snap.kv_capacity_bytes == vexec.kv_capacity_bytes
    assert [(m.model, m.running, m.waiting, m.kv_used_bytes) for m in snap.models] == [(NAME, 0, 0, 0)]
    assert vexec.load(SPEC).already_loaded  # the same source again: no second engine
    with pytest.raises(ModelConflictError):
        vexec.load(ModelSpec(name=NAME, source="tiny://llama"))
    assert vexec.model_names() == (NAME,)


# ------------------------------------------------------------------ requests


async def test_greedy_matches_hf_generate(
    vexec: VllmExecutor, model: VllmLoadedModel, reference: LoadedModel, prompts, hf_greedy
) -> None:
    n = 24
    finished = metric(vexec, "vllm:request_success_total", finished_reason="length") + metric(
        vexec, "vllm:request_success_total", finished_reason="stop"
    )
    generated = metric(vexec, "vllm:generation_tokens_total")
    total = 0
    for i, prompt in enumerate(prompts[:4]):
        req = build_request(model, prompt, max_tokens=n, request_id=f"greedy-{i}")
        assert req.prompt_token_ids == tuple(reference.tokenizer(prompt)["input_ids"])
        expected = hf_greedy(reference, req.prompt_token_ids, n)
        chunks = await vexec.submit(req).collect()
        cc.check_stream(chunks)
        assert cc.ids(chunks) == expected
        assert chunks[-1].finish_reason == (FinishReason.LENGTH if len(expected) == n else FinishReason.EOS)
        assert cc.text(chunks) == reference.tokenizer.decode(expected, skip_special_tokens=True)
        usage = chunks[-1].usage
        assert usage.prompt_tokens == len(req.prompt_token_ids)
        assert 0 <= usage.queue_s <= usage.ttft_s <= usage.latency_s
        total += len(expected)
    after = metric(vexec, "vllm:request_success_total", finished_reason="length") + metric(
        vexec, "vllm:request_success_total", finished_reason="stop"
    )
    assert after - finished == 4
    assert metric(vexec, "vllm:generation_tokens_total") - generated == total
    await cc.wait_for(lambda: scheduler_view(vexec).running == 0, WAIT_S)
    snap = vexec.load_snapshot()
    assert (snap.running, snap.waiting, snap.kv_used_bytes) == (0, 0, 0)
    assert list(snap.requests.rows()) == []


async def test_ttft_counts_from_receipt(vexec: VllmExecutor, model: VllmLoadedModel, prompts) -> None:
    """TTFT and latency count from the request's receipt (``received_s``, before tokenizing), the queue
    time from its arrival in the executor: a receipt 0.5 s earlier adds 0.5 s to TTFT, not to the queue."""
    req = build_request(
        model, prompts[0], max_tokens=2, request_id="received-early", received_s=time.monotonic() - 0.5
    )
    usage = (await vexec.submit(req).collect())[-1].usage
    assert usage.ttft_s - usage.queue_s >= 0.5 and usage.latency_s >= usage.ttft_s


async def test_concurrent_requests(
    vexec: VllmExecutor, model: VllmLoadedModel, reference: LoadedModel, prompts, hf_greedy
) -> None:
    reqs = [
        build_request(model, p, max_tokens=8 + 4 * i, request_id=f"concurrent-{i}")
        for i, p in enumerate(prompts)
    ]
    seeded = [
        build_request(model, prompts[0], max_tokens=16, temperature=0.9, seed=11, request_id=f"seeded-{i}")
        for i in range(2)
    ]
    results = await asyncio.gather(*(vexec.submit(r).collect() for r in [*reqs, *seeded]))
    for req, chunks in zip(reqs, results[: len(reqs)], strict=True):
        cc.check_stream(chunks)
        assert cc.ids(chunks) == hf_greedy(reference, req.prompt_token_ids, req.sampling.max_tokens)
    a, b = results[-2:]
    cc.check_stream(a)
    assert cc.ids(a) == cc.ids(b) and cc.text(a) == cc.text(b)  # the same seed: the same draw


async def test_resume_re_prefills_and_continues(
    vexec: VllmExecutor, model: VllmLoadedModel, reference: LoadedModel, long_prompt
) -> None:
    n = 16
    prompt = long_prompt(reference, n)
    full = await vexec.submit(
        build_request(model, prompt, max_tokens=n, request_id="uninterrupted")
    ).collect()
    ids = cc.ids(full)
    assert len(ids) == n
    for k in (1, 7, n - 1):
        req = build_request(model, prompt, max_tokens=n, resume_token_ids=ids[:k], request_id=f"resume-{k}")
        queried = metric(vexec, "vllm:prefix_cache_queries_total")
        resumed = await vexec.submit(req).collect()
        cc.check_stream(resumed, start=k)
        assert cc.ids(resumed) == ids[k:]
        assert resumed[-1].finish_reason == FinishReason.LENGTH and resumed[-1].usage.completion_tokens == n
        # the text: a client that holds the first k tokens holds the text of the chunks that carried
        # them (vLLM may put several tokens in one chunk, so chunk k is not token k)
        delivered = list(itertools.accumulate(len(c.token_ids) for c in full))
        if k in delivered:
            held = "".join(c.text for c in full[: delivered.index(k) + 1])
            assert held + cc.text(resumed) == cc.text(full)
        else:
            assert cc.text(full).endswith(cc.text(resumed))
        # vLLM was handed the prompt followed by the resumed tokens (token transfer, re-prefilled)
        expected = queried + req.prompt_tokens + k
        await cc.wait_for(lambda e=expected: metric(vexec, "vllm:prefix_cache_queries_total") >= e, WAIT_S)
        assert metric(vexec, "vllm:prefix_cache_queries_total") == expected
    done = await vexec.submit(
        build_request(model, prompt, max_tokens=3, resume_token_ids=ids[:3], request_id="resume-done")
    ).collect()
    assert len(done) == 1 and done[0].finish_reason == FinishReason.LENGTH and done[0].index == 3


async def test_stop_string_ends_the_stream(
    vexec: VllmExecutor, model: VllmLoadedModel, reference: LoadedModel, long_prompt
) -> None:
    n = 24
    prompt = long_prompt(reference, n)
    full = await vexec.submit(build_request(model, prompt, max_tokens=n)).collect()
    text = cc.text(full)
    start = next(
        i
        for i in range(4, len(text) - 3)
        if "\ufffd" not in text[i : i + 3] and text.find(text[i : i + 3]) == i
    )
    stop = text[start : start + 3]
    chunks = await vexec.submit(build_request(model, prompt, max_tokens=n, stop=[stop])).collect()
    cc.check_stream(chunks)
    assert chunks[-1].finish_reason == FinishReason.STOP and cc.text(chunks) == text[:start]
    assert cc.ids(chunks) == cc.ids(full)[: len(cc.ids(chunks))] and len(cc.ids(chunks)) < n
    await cc.wait_for(lambda: scheduler_view(vexec).running == 0, WAIT_S)  # vLLM ended it too


async def test_cancel_and_load_snapshot_from_vllm_stats(
    vexec: VllmExecutor, model: VllmLoadedModel, reference: LoadedModel, long_prompt
) -> None:
    n = 450  # far more steps than the checks below take, so it is still running when cancelled
    prompt = long_prompt(reference, n)
    req = build_request(model, prompt, max_tokens=n, request_id="long")
    stream = vexec.submit(req)
    first = await stream.__anext__()
    assert not first.final
    await cc.wait_for(lambda: scheduler_view(vexec).running == 1, WAIT_S)
    snap = vexec.load_snapshot()
    (load,) = snap.models
    assert (snap.running, snap.waiting, load.running, load.waiting) == (1, 0, 1, 0)
    assert load.kv_tokens >= req.prompt_tokens and load.kv_tokens % block_size(model) == 0  # vLLM's blocks
    assert snap.kv_used_bytes == load.kv_used_bytes == load.kv_tokens * model.kv_bytes_per_token > 0
    ((rid, name, tokens, kv_bytes, phase),) = snap.requests.rows()  # the adapter's own count
    assert (rid, name, phase) == ("long", NAME, "decode") and tokens > req.prompt_tokens
    assert kv_bytes == tokens * model.kv_bytes_per_token
    assert metric(vexec, "vllm:num_requests_running") == 1
    assert metric(vexec, "vllm:kv_cache_usage_perc") > 0
    with pytest.raises(DuplicateRequestError):
        vexec.submit(build_request(model, prompt, max_tokens=5, request_id="long"))

    aborted = metric(vexec, "vllm:request_success_total", finished_reason="abort")
    steps = scheduler_view(vexec).steps
    assert vexec.cancel("long")
    assert not vexec.cancel("long")
    rest = [c async for c in stream]
    assert rest[-1].finish_reason == FinishReason.CANCELLED and rest[-1].usage is not None
    cc.check_stream([first, *rest])
    assert list(vexec.load_snapshot().requests.rows()) == []
    await cc.wait_for(lambda: scheduler_view(vexec).running == 0, WAIT_S)
    # vLLM aborted it: it ran a few more steps at most, far from its remaining tokens
    assert scheduler_view(vexec).steps - steps < (n - len(cc.ids([first, *rest]))) // 2
    snap = vexec.load_snapshot()
    assert (snap.running, snap.waiting, snap.kv_used_bytes) == (0, 0, 0)
    assert metric(vexec, "vllm:request_success_total", finished_reason="abort") == aborted + 1
    assert metric(vexec, "vllm:num_requests_running") == 0

    again = await vexec.submit(build_request(model, prompt, max_tokens=3, request_id="long")).collect()
    assert again[-1].finish_reason == FinishReason.LENGTH and len(cc.ids(again)) == 3

    closed = vexec.submit(build_request(model, prompt, max_tokens=n, request_id="closed"))
    await closed.__anext__()
    await closed.aclose()  # closing a stream cancels its request
    assert list(vexec.load_snapshot().requests.rows()) == []
    reader_stream = vexec.submit(build_request(model, prompt, max_tokens=n, request_id="reader"))
    reader = asyncio.create_task(reader_stream.collect())
    await asyncio.sleep(0)  # the reader waits for its chunks
    await cc.wait_for(lambda: [r[4] for r in vexec.load_snapshot().requests.rows()] == ["decode"], WAIT_S)
    reader.cancel()  # so does cancelling its reader
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert list(vexec.load_snapshot().requests.rows()) == []
    await cc.wait_for(lambda: scheduler_view(vexec).running == 0, WAIT_S)


async def test_prefix_cache_hits_on_a_repeated_prompt(vexec: VllmExecutor, model: VllmLoadedModel) -> None:
    size = block_size(model)
    n_prompt = min(2 * size + size // 2, MAX_MODEL_LEN - 8)  # more than one of vLLM's blocks
    assert n_prompt > size
    prompt = words("b", n_prompt)
    hits: list[float] = []
    cached: list[int] = []  # each final usage's cached_tokens (vLLM's num_cached_tokens)
    for i in range(2):
        req = build_request(model, prompt, max_tokens=2, request_id=f"prefix-{i}")
        assert req.prompt_tokens == n_prompt
        queries, hit = (metric(vexec, f"vllm:prefix_cache_{k}_total") for k in ("queries", "hits"))
        view = scheduler_view(vexec)
        chunks = await vexec.submit(req).collect()
        cc.check_stream(chunks)
        cached.append(chunks[-1].usage.cached_tokens if chunks[-1].usage else -1)
        expected = queries + n_prompt
        await cc.wait_for(lambda e=expected: metric(vexec, "vllm:prefix_cache_queries_total") >= e, WAIT_S)
        assert metric(vexec, "vllm:prefix_cache_queries_total") == expected
        hits.append(metric(vexec, "vllm:prefix_cache_hits_total") - hit)
        after = scheduler_view(vexec)
        assert after.prefix_queries - view.prefix_queries == n_prompt
        assert after.prefix_hits - view.prefix_hits == hits[-1]
    assert hits[0] == 0  # nothing of it was cached
    # the repeat finds its full blocks cached (never the last token, which vLLM computes again)
    assert size <= hits[1] < n_prompt and hits[1] % size == 0
    assert cached == [0, hits[1]]
    cache = vexec.load_snapshot().prefix_cache  # the load report carries vLLM's totals
    assert cache is not None
    view = scheduler_view(vexec)
    assert (cache.queries, cache.hits) == (view.prefix_queries, view.prefix_hits)


async def test_load_report_counts_the_blocks_vllm_caches(vexec: VllmExecutor, model: VllmLoadedModel) -> None:
    """vLLM's KV-cache events reach the load report: the blocks its prefix cache holds (held or idle),
    out of its blocks, so the scheduler's load monitor gives cache-aware dispatch the cache's size."""
    size = block_size(model)
    total = int(model.model.vllm_config.cache_config.num_gpu_blocks) - 1  # but vLLM's null block
    before = vexec.load_snapshot()
    assert before.kv_blocks_total == total
    assert before.prefix_cache is not None
    n_prompt = 3 * size + size // 2  # three full blocks, none of them cached yet
    req = build_request(model, words("c", n_prompt), max_tokens=2, request_id="counted-blocks")
    cc.check_stream(await vexec.submit(req).collect())
    expected = before.prefix_cache.blocks + 3  # the prompt's full blocks (its output fills none)

    def blocks() -> int:
        cache = vexec.load_snapshot().prefix_cache
        return cache.blocks if cache is not None else -1

    await cc.wait_for(lambda: blocks() >= expected, WAIT_S)
    assert blocks() == expected  # the request finished: they stay cached, idle
    snap = vexec.load_snapshot()
    report = report_from_proto(snapshot_to_proto(snap, "vllm-engine"))
    assert report.prefix_cached_bytes == expected * snap.kv_capacity_bytes // total
    hits = scheduler_view(vexec).prefix_hits
    again = build_request(model, words("c", n_prompt), max_tokens=2, request_id="counted-again")
    cc.check_stream(await vexec.submit(again).collect())
    await cc.wait_for(lambda: scheduler_view(vexec).prefix_hits >= hits + 3 * size, WAIT_S)
    assert blocks() == expected  # a hit caches nothing new


def test_no_prefix_cache_is_reported_with_caching_off(models_dir: Path) -> None:
    """With vLLM's prefix caching off the load report carries no prefix cache (as a native engine's
    without caching), not one of zeros; with it on, the report has one before any model loads."""
    for caching in (False, True):
        settings = SETTINGS.model_copy(update={"enable_prefix_caching": caching})
        executor = VllmExecutor(VllmConfig(settings=settings, device=VLLM_DEVICE, cache_dir=models_dir))
        try:
            assert (executor.load_snapshot().prefix_cache is not None) is caching
        finally:
            executor.close()


async def test_context_limit(
    vexec: VllmExecutor, model: VllmLoadedModel, reference: LoadedModel, hf_greedy
) -> None:
    too_long = words("a", MAX_MODEL_LEN + 40)
    with pytest.raises(ValidationError, match=f"context limit of {MAX_MODEL_LEN}"):
        build_request(model, too_long, max_tokens=1)
    at_limit = words("a", MAX_MODEL_LEN - 1)
    with pytest.raises(ValidationError, match=f"exceeds the context limit of {MAX_MODEL_LEN}"):
        build_request(model, at_limit, max_tokens=2)
    req = build_request(model, at_limit, max_tokens=1, request_id="at-limit")  # 511 + 1 = 512: fits
    chunks = await vexec.submit(req).collect()
    cc.check_stream(chunks)
    assert cc.ids(chunks) == hf_greedy(reference, req.prompt_token_ids, 1)
    # a request past the check (built for a longer context): vLLM refuses it and the stream ends ERROR
    small = build_request(model, "hi", max_tokens=4, request_id="past-limit")
    ids = tuple(reference.tokenizer(too_long)["input_ids"])
    chunks = await vexec.submit(dataclasses.replace(small, prompt_token_ids=ids)).collect()
    cc.check_stream(chunks)
    assert chunks[-1].finish_reason == FinishReason.ERROR and cc.ids(chunks) == []
    # the executor keeps serving
    req = build_request(model, "The quick brown fox", max_tokens=8, request_id="after-limit")
    chunks = await vexec.submit(req).collect()
    assert cc.ids(chunks) == hf_greedy(reference, req.prompt_token_ids, 8)
    assert vexec.model_names() == (NAME,)


# ------------------------------------------------------------------ the gRPC service


async def test_servicer_over_the_vllm_executor(
    vexec: VllmExecutor, reference: LoadedModel, hf_greedy
) -> None:
    """The Engine gRPC service runs unchanged on this backend; KV transfer answers FAILED_PRECONDITION."""
    servicer = EngineServicer(vexec, "vllm-engine")
    server = await GrpcServer(
        [(engine_pb2_grpc.add_EngineServicer_to_server, servicer, service_name(engine_pb2, "Engine"))]
    ).start()
    channel = open_channel(server.address)
    try:
        stub = engine_pb2_grpc.EngineStub(channel)
        prompt = "The quick brown fox"
        request = engine_pb2.GenerateRequest(
            model=NAME, prompt=prompt, sampling=common_pb2.SamplingParams(max_tokens=8)
        )
        chunks = [c async for c in stub.Generate(request)]
        expected = hf_greedy(reference, reference.tokenizer(prompt)["input_ids"], 8)
        assert [t for c in chunks for t in c.token_ids] == expected
        assert "".join(c.text for c in chunks) == reference.tokenizer.decode(
            expected, skip_special_tokens=True
        )
        assert chunks[-1].finish_reason in (common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_EOS)
        info = await stub.GetInfo(engine_pb2.GetInfoRequest())
        assert info.backend == "vllm" and info.device == VLLM_DEVICE
        assert [m.name for m in info.models] == [NAME] and info.max_migrations == 0
        assert info.kv_capacity_bytes == vexec.kv_capacity_bytes
        snapshots = stub.WatchLoad(engine_pb2.WatchLoadRequest(interval_s=0.05))
        snapshot = await snapshots.read()
        snapshots.cancel()
        assert [m.model for m in snapshot.models] == [NAME]
        too_long = engine_pb2.GenerateRequest(
            model=NAME,
            prompt=words("a", MAX_MODEL_LEN + 40),
            sampling=common_pb2.SamplingParams(max_tokens=1),
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.Generate(too_long):
                pass
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"context limit of {MAX_MODEL_LEN}" in refused.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.ExportKv(engine_pb2.ExportKvRequest(request_id="x")):
                pass
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "re-prefill" in refused.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Migrate(engine_pb2.MigrateRequest(request_id="x", destination="localhost:1"))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        await channel.close()
        await server.stop(0)
    assert vexec.attach("anything") is None and not vexec.cancel_if_unattached("anything")


# ------------------------------------------------------------------ a second model (another vLLM start)


async def test_second_model_loads_serves_and_unloads(
    vexec: VllmExecutor, model: VllmLoadedModel, reference: LoadedModel, hf_greedy, long_prompt
) -> None:
    single = vexec.kv_capacity_bytes
    alone = vexec.load_snapshot()
    blocks_alone = alone.kv_blocks_total
    cached_alone = alone.prefix_cache.blocks if alone.prefix_cache is not None else 0
    changes: list[tuple[str, ...]] = []
    vexec.on_models_changed.append(changes.append)
    try:
        result = await vexec.load_async(SECOND)
        assert not result.already_loaded and result.model.name == SECOND.name
        assert vexec.model_names() == (NAME, SECOND.name)
        assert vexec.kv_capacity_bytes == 2 * single
        with pytest.raises(ModelLoadError, match="max_models=2"):
            vexec.load(ModelSpec(name="third", source=VLLM_TINY_SOURCE))
        second = vexec.models[SECOND.name]
        n = 300
        prompt = long_prompt(reference, n)
        pair = [build_request(m, prompt, max_tokens=12, request_id=f"on-{m.name}") for m in (model, second)]
        results = await asyncio.gather(*(vexec.submit(r).collect() for r in pair))  # both at once
        expected = hf_greedy(reference, pair[0].prompt_token_ids, 12)
        assert [cc.ids(chunks) for chunks in results] == [expected, expected]
        both = vexec.load_snapshot()
        assert [m.model for m in both.models] == [NAME, SECOND.name]
        assert both.kv_capacity_bytes == 2 * single
        assert both.kv_blocks_total == 2 * blocks_alone
        # each engine's cached blocks are counted from its own events: a prompt of two full blocks on
        # the second engine adds two to the node's count (the pair above filled none: short prompts)
        size = block_size(model)
        filled = build_request(second, words("e", 2 * size + size // 2), max_tokens=2, request_id="e-blocks")
        cc.check_stream(await vexec.submit(filled).collect())

        def cached() -> int:
            cache = vexec.load_snapshot().prefix_cache
            return cache.blocks if cache is not None else -1

        await cc.wait_for(lambda: cached() >= cached_alone + 2, WAIT_S)
        assert cached() == cached_alone + 2

        moving = build_request(second, prompt, max_tokens=n, request_id="on-second")
        stream = vexec.submit(moving)
        first = await stream.__anext__()
        assert await asyncio.to_thread(vexec.unload, SECOND.name)  # with its request in flight
        rest = [c async for c in stream]
        assert rest[-1].finish_reason == FinishReason.CANCELLED
        cc.check_stream([first, *rest])
        delivered = cc.ids([first, *rest])
        assert len(delivered) < n
        assert delivered == hf_greedy(reference, moving.prompt_token_ids, n)[: len(delivered)]
        assert vexec.model_names() == (NAME,) and vexec.kv_capacity_bytes == single
        after = vexec.load_snapshot()
        assert [m.model for m in after.models] == [NAME]
        # the second engine's cache went with it
        assert after.kv_blocks_total == blocks_alone and cached() == cached_alone
        assert not vexec.unload(SECOND.name)
        with pytest.raises(UnknownModelError):
            vexec.submit(build_request(second, "hi", max_tokens=2))
        assert changes == [(NAME, SECOND.name), (NAME,)]
        # the first model goes on serving
        req = build_request(model, "Once upon a time", max_tokens=8, request_id="after-unload")
        assert cc.ids(await vexec.submit(req).collect()) == hf_greedy(reference, req.prompt_token_ids, 8)
    finally:
        vexec.on_models_changed.remove(changes.append)
        await asyncio.to_thread(vexec.unload, SECOND.name)
