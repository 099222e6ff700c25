"""The continuous executor: greedy parity with HF generate, sampling, stops, limits, cancellation."""

from __future__ import annotations

import asyncio
import dataclasses

import chunk_checks as cc
import pytest
from llmfleet.api.v1 import common_pb2
from llmfleet.testing import eventually
from llmfleet.types import ModelSpec
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.models import LoadedModel, ModelSourceNotFound
from llmfleet_engine.outputs import (
    DuplicateRequestError,
    FinishReason,
    ModelConflictError,
    QueueFullError,
)
from llmfleet_engine.text import IncrementalDetokenizer, TextStream
from llmfleet_engine.validation import UnknownModelError, build_request


def test_finish_reason_values_match_proto() -> None:
    for reason in FinishReason:
        assert common_pb2.FinishReason.Value(f"FINISH_REASON_{reason.name}") == reason.value


# ------------------------------------------------------------------ text handling


def test_incremental_detokenizer_never_splits_characters(llama: LoadedModel) -> None:
    text = "héllo 日本語 🙂👍🏽 naïve"
    ids = llama.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text) / 2  # multi-byte characters span several tokens
    detok = IncrementalDetokenizer(llama.tokenizer)
    deltas = [detok.push(t) for t in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.flush() == text


def test_text_stream_holds_back_possible_stop(llama: LoadedModel) -> None:
    ids = llama.tokenizer("the cat sat. the cab ran", add_special_tokens=False)["input_ids"]
    stream = TextStream(llama.tokenizer, stop=["cab", "sat!"])
    released, stopped = "", False
    for t in ids:
        out, stopped = stream.push(t)
        released += out
        assert not released.endswith(("c", "ca", "s", "sa", "sat"))  # never a possible stop start
        if stopped:
            break
    assert stopped
    assert released == "the cat sat. the "


def test_text_stream_flushes_unmatched_prefix(llama: LoadedModel) -> None:
    ids = llama.tokenizer("all done ST", add_special_tokens=False)["input_ids"]
    stream = TextStream(llama.tokenizer, stop=["STOP"])
    released = "".join(stream.push(t)[0] for t in ids)
    assert released == "all done "
    assert stream.finish() == "ST"


# ------------------------------------------------------------------ greedy parity


@pytest.mark.parametrize("fixture", ["llama", "qwen2"])
async def test_greedy_matches_hf_generate(
    executor: Executor, fixture: str, request, prompts, hf_greedy
) -> None:
    model: LoadedModel = request.getfixturevalue(fixture)
    n = 24
    for prompt in prompts[:4]:
        req = build_request(model, prompt, max_tokens=n)
        expected = hf_greedy(model, req.prompt_token_ids, n)
        chunks = await executor.submit(req).collect()
        cc.check_stream(chunks)
        assert cc.ids(chunks) == expected
        reason = FinishReason.LENGTH if len(expected) == n else FinishReason.EOS
        assert chunks[-1].finish_reason == reason
        assert cc.text(chunks) == model.tokenizer.decode(expected, skip_special_tokens=True)
        usage = chunks[-1].usage
        assert usage.prompt_tokens == len(req.prompt_token_ids)
        assert 0 <= usage.queue_s <= usage.ttft_s <= usage.latency_s


async def test_greedy_interleaved_requests_match(
    make_executor, llama: LoadedModel, qwen2: LoadedModel, prompts, hf_greedy
) -> None:
    executor = make_executor(max_running=8)
    n = 20
    pairs = [(m, build_request(m, p, max_tokens=n)) for m in (llama, qwen2) for p in prompts[:4]]
    reqs = [r for _, r in pairs]
    expected = [hf_greedy(m, r.prompt_token_ids, n) for m, r in pairs]
    streams = [executor.submit(r) for r in reqs]
    results = await asyncio.gather(*(s.collect() for s in streams))
    for chunks, exp in zip(results, expected, strict=True):
        cc.check_stream(chunks)
        assert cc.ids(chunks) == exp


@pytest.mark.parametrize("interval", [0.0, 30.0])
async def test_stream_interval_keeps_one_chunk_per_token(
    make_executor, llama: LoadedModel, qwen2: LoadedModel, prompts, hf_greedy, interval: float
) -> None:
    # 0: consumers woken after every iteration; 30 s: only first tokens, finals and an idle worker wake
    # them, so the streams must still complete at once, token by token, with the consumer's text
    executor = make_executor(stream_interval_s=interval)
    n = 16
    reqs = [build_request(m, p, max_tokens=n) for m in (llama, qwen2) for p in prompts[:3]]
    stop = build_request(llama, prompts[0], max_tokens=n, stop=["\x00never"])  # text made by the worker
    models = [llama] * 3 + [qwen2] * 3 + [llama]
    results = await asyncio.wait_for(
        asyncio.gather(*(executor.submit(r).collect() for r in [*reqs, stop])), 10
    )
    for model, req, chunks in zip(models, [*reqs, stop], results, strict=True):
        expected = hf_greedy(model, req.prompt_token_ids, n)
        cc.check_stream(chunks)
        assert all(len(c.token_ids) <= 1 for c in chunks)
        assert cc.ids(chunks) == expected
        assert cc.text(chunks) == model.tokenizer.decode(expected, skip_special_tokens=True)


async def test_held_output_is_released_when_the_worker_idles(make_executor, endless: LoadedModel) -> None:
    executor = make_executor(stream_interval_s=30.0)
    stream = executor.submit(build_request(endless, "The quick brown fox", max_tokens=1500, request_id="p"))
    first = await asyncio.wait_for(stream.__anext__(), 5)  # a first token is never held back
    assert first.index == 0
    header = await asyncio.to_thread(
        executor.migration.pause_request, "p"
    )  # nothing left to run: the worker idles
    generated = len(header.generated_token_ids)
    got = [first]
    while len(got) < generated:
        got.append(await asyncio.wait_for(stream.__anext__(), 5))
    assert cc.ids(got) == list(header.generated_token_ids)
    assert executor.cancel("p")
    assert (await stream.__anext__()).finish_reason == FinishReason.CANCELLED


def test_stream_interval_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="stream_interval_s"):
        ExecutorConfig(stream_interval_s=-1.0)


async def test_waiting_queue_is_fifo(make_executor, llama: LoadedModel, long_prompt) -> None:
    executor = make_executor(max_running=1)
    prompt = long_prompt(llama, 30)
    reqs = [build_request(llama, prompt, max_tokens=30, request_id=f"r{i}") for i in range(3)]
    streams = [executor.submit(r) for r in reqs]
    snap = executor.load_snapshot()
    assert snap.running + snap.waiting == 3 and snap.running <= 1
    results = await asyncio.gather(*(s.collect() for s in streams))
    finished = [c[-1].usage for c in results]
    assert finished[0].latency_s < finished[1].latency_s < finished[2].latency_s
    assert finished[2].queue_s > finished[0].queue_s
    assert all(cc.ids(c) == cc.ids(results[0]) for c in results)


async def test_resume_continues_numbering(executor: Executor, llama: LoadedModel, long_prompt) -> None:
    n = 16
    prompt = long_prompt(llama, n)
    full = await executor.submit(build_request(llama, prompt, max_tokens=n)).collect()
    ids = cc.ids(full)
    for k in range(1, n):  # every split point, including ones inside multi-byte characters
        req = build_request(llama, prompt, max_tokens=n, resume_token_ids=ids[:k])
        resumed = await executor.submit(req).collect()
        cc.check_stream(resumed, start=k)
        assert cc.ids(resumed) == ids[k:]
        assert resumed[-1].finish_reason == FinishReason.LENGTH
        assert resumed[-1].usage.completion_tokens == n
        delivered = "".join(c.text for c in full[:k])  # what the client had from the first engine
        assert delivered + cc.text(resumed) == cc.text(full)


async def test_resume_already_complete(executor: Executor, llama: LoadedModel) -> None:
    chunks = await executor.submit(
        build_request(llama, "hi", max_tokens=3, resume_token_ids=[5, 6, 7])
    ).collect()
    assert len(chunks) == 1 and chunks[0].finish_reason == FinishReason.LENGTH and chunks[0].index == 3


# ------------------------------------------------------------------ sampling, stops, limits


async def test_seeded_sampling_is_reproducible(executor: Executor, qwen2: LoadedModel) -> None:
    async def run(seed: int) -> list[int]:
        req = build_request(qwen2, "Once upon a time", max_tokens=24, temperature=1.0, top_p=0.9, seed=seed)
        return cc.ids(await executor.submit(req).collect())

    a, b, c = await asyncio.gather(run(11), run(11), run(12))
    assert a == b
    assert a != c


async def test_a_seeded_request_resumed_from_its_tokens_continues_the_same(
    executor: Executor, qwen2: LoadedModel
) -> None:
    """Each seeded draw depends on (seed, position) alone: a request resumed elsewhere from its first k
    tokens (failover, another scheduler replica) goes on exactly as the uninterrupted one."""

    def req(resume: list[int] = [], rid: str = "") -> object:  # noqa: B006 - read only
        return build_request(
            qwen2, "Once upon a time", max_tokens=24, temperature=1.0, top_p=0.9, seed=5,
            resume_token_ids=resume, request_id=rid,
        )  # fmt: skip

    whole = cc.ids(await executor.submit(req(rid="whole")).collect())
    for k in (1, 10, 23):
        rest = cc.ids(await executor.submit(req(whole[:k], f"resumed-{k}")).collect())
        assert rest == whole[k:], k


async def test_stop_string_cuts_output(executor: Executor, llama: LoadedModel, long_prompt) -> None:
    n = 30
    prompt = long_prompt(llama, n)
    full = await executor.submit(build_request(llama, prompt, max_tokens=n)).collect()
    text = cc.text(full)
    start = next(
        i
        for i in range(4, len(text) - 3)
        if "\ufffd" not in text[i : i + 3] and text.find(text[i : i + 3]) == i
    )
    stop = text[start : start + 3]
    chunks = await executor.submit(
        build_request(llama, prompt, max_tokens=n, stop=[stop, "never-there"])
    ).collect()
    cc.check_stream(chunks)
    assert chunks[-1].finish_reason == FinishReason.STOP
    assert cc.text(chunks) == text[:start]
    assert cc.ids(chunks) == cc.ids(full)[: len(cc.ids(chunks))]
    assert len(cc.ids(chunks)) < n


async def test_max_tokens_finishes_with_length(executor: Executor, llama: LoadedModel, long_prompt) -> None:
    prompt = long_prompt(llama, 5)
    chunks = await executor.submit(build_request(llama, prompt, max_tokens=5)).collect()
    assert len(cc.ids(chunks)) == 5
    assert chunks[-1].finish_reason == FinishReason.LENGTH and chunks[-1].usage.completion_tokens == 5


async def test_eos_finishes_without_emitting_it(
    executor: Executor, llama: LoadedModel, long_prompt, hf_greedy
) -> None:
    prompt = long_prompt(llama, 12)
    reference = hf_greedy(llama, llama.tokenizer(prompt)["input_ids"], 12)
    eos = reference[6]
    first = reference.index(eos)
    executor.host.add_loaded(dataclasses.replace(llama, name="eos-llama", eos_token_ids=frozenset({eos})))
    chunks = await executor.submit(
        build_request(executor.host.models["eos-llama"], prompt, max_tokens=12)
    ).collect()
    assert chunks[-1].finish_reason == FinishReason.EOS
    assert cc.ids(chunks) == reference[:first]
    assert chunks[-1].token_ids == () and chunks[-1].usage.completion_tokens == first


# ------------------------------------------------------------------ cancellation and unload


async def test_cancel_frees_request(executor: Executor, endless: LoadedModel) -> None:
    req = build_request(endless, "The quick brown fox", max_tokens=1500, request_id="long")
    stream = executor.submit(req)
    first = await stream.__anext__()
    assert not first.final
    snap = executor.load_snapshot()
    assert snap.running == 1
    model_load = next(m for m in snap.models if m.model == endless.name)
    assert model_load.kv_tokens >= req.prompt_tokens
    assert model_load.kv_used_bytes == model_load.kv_tokens * endless.kv_bytes_per_token
    assert executor.cancel("long")
    assert not executor.cancel("long")
    rest = [c async for c in stream]
    assert rest[-1].finish_reason == FinishReason.CANCELLED
    snap = executor.load_snapshot()
    assert (snap.running, snap.waiting) == (0, 0)
    # Blocks of a request cancelled mid-iteration are freed when that iteration ends.
    await eventually(lambda: executor.load_snapshot().kv_used_bytes == 0, 5, "the KV blocks to be freed")
    assert executor.load_snapshot().kv_blocks_used == 0


async def test_closing_stream_or_cancelling_reader_cancels(executor: Executor, endless: LoadedModel) -> None:
    stream = executor.submit(build_request(endless, "The quick brown fox", max_tokens=1500))
    await stream.__anext__()
    await stream.aclose()
    assert executor.load_snapshot().running == 0

    stream = executor.submit(build_request(endless, "The quick brown fox", max_tokens=1500))
    reader = asyncio.create_task(stream.collect())
    await cc.wait_for(lambda: executor.load_snapshot().running == 1)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert executor.load_snapshot().running == 0


async def test_unload_cancels_running_requests(
    executor: Executor, llama: LoadedModel, qwen2: LoadedModel, endless: LoadedModel
) -> None:
    changes: list[tuple[str, ...]] = []
    executor.host.on_models_changed.append(changes.append)
    stream = executor.submit(build_request(endless, "The quick brown fox", max_tokens=1500))
    await stream.__anext__()
    assert executor.host.unload(endless.name)
    assert not executor.host.unload(endless.name)
    rest = [c async for c in stream]
    assert rest[-1].finish_reason == FinishReason.CANCELLED
    assert changes == [(llama.name, qwen2.name)]
    with pytest.raises(UnknownModelError):
        executor.submit(build_request(endless, "hi"))


async def test_submit_errors(make_executor, llama: LoadedModel, endless: LoadedModel) -> None:
    executor = make_executor(max_running=1, max_waiting=1)
    streams = [executor.submit(build_request(endless, "The quick brown fox", max_tokens=500, request_id="a"))]
    await streams[0].__anext__()
    with pytest.raises(DuplicateRequestError):
        executor.submit(build_request(llama, "x", request_id="a"))
    streams.append(executor.submit(build_request(llama, "x", max_tokens=5, request_id="b")))
    with pytest.raises(QueueFullError):
        executor.submit(build_request(llama, "x", request_id="c"))
    assert executor.load_snapshot().waiting == 1
    for s in streams:
        await s.aclose()


# ------------------------------------------------------------------ models and load reports


def test_load_is_idempotent_and_reconciles(cache_dir, make_executor) -> None:
    executor = make_executor()
    changes: list[tuple[str, ...]] = []
    executor.host.on_models_changed.append(changes.append)
    spec = ModelSpec("m", "tiny://mistral")
    first = executor.host.load(spec)
    assert not first.already_loaded and first.model.architecture == "MistralForCausalLM"
    assert executor.host.load(spec).already_loaded
    with pytest.raises(ModelConflictError):
        executor.host.load(ModelSpec("m", "tiny://llama"))
    with pytest.raises(ModelSourceNotFound):
        executor.host.load(ModelSpec("x", "tiny://nope"))
    assert changes == [("m", "tiny-llama", "tiny-llama-endless", "tiny-qwen2")]
    result = executor.host.reconcile([ModelSpec("m", "tiny://mistral"), ModelSpec("bad", "tiny://nope")])
    assert sorted(result.unloaded) == ["tiny-llama", "tiny-llama-endless", "tiny-qwen2"]
    assert result.loaded == [] and "bad" in result.errors
    assert executor.host.model_names() == ("m",)


async def test_snapshot_reports_throughput(executor: Executor, llama: LoadedModel) -> None:
    before = executor.load_snapshot()
    assert before.tokens_per_s == 0 and before.kv_capacity_bytes > 0
    assert {m.model for m in before.models} == {"tiny-llama", "tiny-llama-endless", "tiny-qwen2"}
    await executor.submit(build_request(llama, "The quick brown fox", max_tokens=10)).collect()
    assert executor.load_snapshot().tokens_per_s > 0
