"""The paged executor: several models over one unified pool, policies, preemption, KV transfer."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import pytest
import torch
from llmfleet.kvblocks import KvShape
from llmfleet.testing import eventually
from llmfleet_engine import profiling
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.memory import peak_activation_bytes
from llmfleet_engine.models import LoadedModel
from llmfleet_engine.outputs import FinishReason, ResourceExhaustedError, TransferError
from llmfleet_engine.validation import build_request


def ids(chunks) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def greedy_no_eos(model: LoadedModel, prompt: str, n: int) -> list[int]:
    """Reference continuation ignoring EOS: full-sequence HF forwards, argmax each step."""
    seq = list(model.tokenizer(prompt)["input_ids"])
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            logits = model.model(torch.tensor([seq])).logits[0, -1]
            token = int(torch.argmax(logits))
            out.append(token)
            seq.append(token)
    return out


def budget_for(models: Sequence[LoadedModel], blocks: int, block_bytes: int, prefill: int, batch: int) -> int:
    """A memory budget holding the models' reservations plus exactly ``blocks`` KV blocks."""
    total = 0
    for m in models:
        reserve = m.weight_bytes + peak_activation_bytes(m.model.config, 4, prefill, batch)
        total += -(-reserve // block_bytes)
    return (total + blocks) * block_bytes


async def test_three_architectures_in_mixed_batches_match_hf(make_executor, llama, qwen2, mistral, hf_greedy):
    ex = make_executor(max_batch_requests=8)
    ex.host.add_loaded(mistral)
    work = [
        (m, p, n)
        for m in (llama, qwen2, mistral)
        for p, n in (("The quick brown fox", 12), ("A much longer prompt about fleets of models", 7))
    ]
    streams = [ex.submit(build_request(m, p, max_tokens=n)) for m, p, n in work]
    results = await asyncio.gather(*(s.collect() for s in streams))
    for (m, p, n), chunks in zip(work, results, strict=True):
        assert ids(chunks) == hf_greedy(m, m.tokenizer(p)["input_ids"], n), (m.name, p)


async def test_two_models_share_one_pool(make_executor, endless, qwen2):
    # FCFS would run the older request's model to completion first; the doubling budget with a small
    # prior alternates between the two services, so both hold KV in the same pool at once.
    ex = make_executor(policy="doubling_budget", options={"default_mean_s": 0.005, "default_std_s": 0.0})
    # without EOS the sampled qwen2 request runs its 1500 tokens too (an EOS after a few dozen tokens
    # made the overlap a window of a few fast iterations, shorter than the 50 ms poll)
    qwen2 = dataclasses.replace(qwen2, name="tiny-qwen2-endless", eos_token_ids=frozenset())
    ex.host.add_loaded(qwen2)
    a = ex.submit(build_request(endless, "Shared pools", max_tokens=1500))
    b = ex.submit(build_request(qwen2, "Shared pools", max_tokens=1500, temperature=1.0, seed=1))

    def both_hold_kv() -> bool:
        per = {m.model: m.kv_blocks for m in ex.load_snapshot().models}
        return per[endless.name] > 0 and per[qwen2.name] > 0

    await eventually(both_hold_kv, 10, "both models to hold blocks of the shared pool")
    snap = ex.load_snapshot()
    per = {m.model: m for m in snap.models}
    assert per[endless.name].kv_blocks > 0 and per[qwen2.name].kv_blocks > 0
    assert per[endless.name].tokens_per_block != per[qwen2.name].tokens_per_block  # different shapes
    assert sum(m.kv_blocks for m in snap.models) == snap.kv_blocks_used
    a.close()
    b.close()
    await eventually(lambda: ex.load_snapshot().kv_blocks_used == 0, 5, "all blocks back")


async def test_unloading_one_model_leaves_the_other_undisturbed(make_executor, endless, qwen2):
    ex = make_executor()
    prompt = "Unload the neighbour"
    keep = ex.submit(build_request(endless, prompt, max_tokens=120))
    drop = ex.submit(build_request(qwen2, prompt, max_tokens=500, temperature=1.0, seed=3))
    await drop.__anext__()
    assert await asyncio.to_thread(ex.host.unload, qwen2.name)
    dropped = [c async for c in drop]
    assert dropped[-1].finish_reason == FinishReason.CANCELLED
    assert ids(await keep.collect()) == greedy_no_eos(endless, prompt, 120)
    assert qwen2.name not in ex.host.model_names()


async def test_preemption_by_recompute_keeps_greedy_output(make_executor, llama, qwen2, endless):
    block = 4096  # 8 tokens of the tiny llama per block
    fixture_models = [llama, qwen2, endless]  # make_executor loads all three; each reserves its share
    ex = make_executor(
        block_bytes=block,
        max_prefill_tokens=256,
        max_batch_requests=8,
        memory_budget_bytes=budget_for(fixture_models, 24, block, 256, 8),
    )
    assert ex.load_snapshot().kv_blocks_total == 24
    prompts = [f"Request number {i} starts a long story about engines" for i in range(4)]
    streams = [ex.submit(build_request(endless, p, max_tokens=60)) for p in prompts]
    results = await asyncio.gather(*(s.collect() for s in streams))
    assert ex.preemptions > 0, "the pool was sized to force preemption"
    for p, chunks in zip(prompts, results, strict=True):
        assert ids(chunks) == greedy_no_eos(endless, p, 60)
    await eventually(lambda: ex.load_snapshot().kv_blocks_used == 0, 5, "all blocks back")


async def test_request_that_can_never_fit_is_refused_with_sizes(make_executor, llama, qwen2, endless):
    block = 4096
    ex = make_executor(
        block_bytes=block, memory_budget_bytes=budget_for([llama, qwen2, endless], 64, block, 4096, 32)
    )
    total = ex.load_snapshot().kv_blocks_total
    too_long = build_request(endless, "x", max_tokens=min(endless.max_context - 8, 8 * total + 64))
    with pytest.raises(ResourceExhaustedError, match="usable blocks"):
        ex.submit(too_long)


def test_model_that_does_not_fit_the_budget_is_refused(cache_dir, llama):
    ex = Executor(
        ExecutorConfig(
            cache_dir=cache_dir, memory_budget_bytes=64 * 4096, block_bytes=4096, allow_download=False
        )
    )
    try:
        with pytest.raises(ResourceExhaustedError, match="do not fit"):
            ex.host.add_loaded(llama)
        assert ex.host.model_names() == ()
    finally:
        ex.close()


async def test_doubling_budget_policy_serves_two_services(make_executor, llama, qwen2, hf_greedy):
    ex = make_executor(policy="doubling_budget")
    assert ex.policy.name == "doubling_budget"
    work = [(llama, "short", 5, "fast"), (qwen2, "a longer request", 20, "slow"), (llama, "again", 9, "fast")]
    streams = [
        ex.submit(dataclasses.replace(build_request(m, p, max_tokens=n), service=svc))
        for m, p, n, svc in work
    ]
    results = await asyncio.gather(*(s.collect() for s in streams))
    for (m, p, n, _), chunks in zip(work, results, strict=True):
        assert ids(chunks) == hf_greedy(m, m.tokenizer(p)["input_ids"], n)


def test_profile_sweeps_both_phases(make_executor, llama):
    ex = make_executor()
    result = profiling.profile(
        ex, llama.name, batch_sizes=[1, 2], input_lengths=[8, 32], context_lengths=[16], repeats=2
    )
    points = {(s.phase, s.batch_size, s.tokens) for s in result.samples}
    assert points == {("prefill", b, n) for b in (1, 2) for n in (8, 32)} | {
        ("decode", b, 16) for b in (1, 2)
    }
    assert all(s.seconds > 0 for s in result.samples) and len(result.samples) == 2 * len(points)
    assert ex.load_snapshot().kv_blocks_used == 0  # temporary sequences freed
    with pytest.raises(ValueError, match="context"):
        profiling.profile(ex, llama.name, input_lengths=[llama.max_context])


async def migrate_in_process(src: Executor, dst: Executor, request_id: str, chunk_tokens: int) -> int:
    header = await asyncio.to_thread(src.migration.pause_request, request_id)
    handle = dst.migration.begin_import(header)
    for start in range(0, header.num_tokens, chunk_tokens):
        end = min(start + chunk_tokens, header.num_tokens)
        handle.write(start, end - start, src.migration.export_kv(request_id, start, end))
    handle.commit(asyncio.get_running_loop())
    src.migration.finish_migrated(request_id, "dst:1")
    return header.num_tokens


async def test_export_import_between_pools_with_different_block_sizes(make_executor, endless):
    src = make_executor(block_bytes=4096)
    dst = make_executor(block_bytes=64 * 1024)
    prompt = "Migrate me across the fleet"
    stream = src.submit(build_request(endless, prompt, max_tokens=80, request_id="mig"))
    head = [await stream.__anext__() for _ in range(10)]
    moved = await migrate_in_process(src, dst, "mig", chunk_tokens=7)
    rest_src = [c async for c in stream]
    assert rest_src[-1].finish_reason == FinishReason.MIGRATED and rest_src[-1].migrated_to == "dst:1"
    attached = dst.attach("mig")
    assert attached is not None and dst.attach("mig") is None  # one consumer
    tail = await attached.collect()
    assert tail[0].index == len(ids(head + rest_src))  # numbering continues
    assert ids(head + rest_src + tail) == greedy_no_eos(endless, prompt, 80)
    assert moved >= len(endless.tokenizer(prompt)["input_ids"]) + 9
    await eventually(lambda: src.load_snapshot().kv_blocks_used == 0, 5, "source blocks freed")
    await eventually(lambda: dst.load_snapshot().kv_blocks_used == 0, 5, "destination blocks freed")


async def test_import_mismatch_allocates_nothing(make_executor, endless, qwen2):
    src, dst = make_executor(), make_executor()
    stream = src.submit(build_request(endless, "mismatch", max_tokens=200, request_id="m"))
    await stream.__anext__()
    header = await asyncio.to_thread(src.migration.pause_request, "m")
    before = dst.load_snapshot().kv_blocks_used
    bad_shape = dataclasses.replace(header, shape=KvShape(9, 1, 8, "float32"))
    with pytest.raises(TransferError, match="shape mismatch"):
        dst.migration.begin_import(bad_shape)
    with pytest.raises(TransferError, match="not loaded"):
        dst.migration.begin_import(dataclasses.replace(header, model="ghost"))
    assert dst.load_snapshot().kv_blocks_used == before
    handle = dst.migration.begin_import(header)  # a broken transfer: abort frees the reservation
    assert dst.load_snapshot().kv_blocks_used > before
    handle.abort()
    assert dst.load_snapshot().kv_blocks_used == before
    assert src.migration.resume_request("m")  # the source carries on
    more = await stream.__anext__()
    assert more.finish_reason is None
    stream.close()


@pytest.mark.parametrize("slice_end", ["keep", "recompute"])
async def test_static_mode_slices_keep_greedy_output(make_executor, endless, slice_end):
    """Static batching (SCLS-style slices of 3 iterations, batches of 2) in both slice-end modes: every
    request still yields transformers' greedy tokens; recompute mode is the engine core's static mode
    (padded rows, unfinished rows re-prefilled at a slice end), keep mode never drops KV."""
    ex = make_executor(
        policy="static_sls",
        options={"batch_size": 2, "max_iterations": 3, "slice_end": slice_end},
    )
    recompute = slice_end == "recompute"
    assert ex.core.static == recompute
    assert ex.policy.name == ("static_sls" if recompute else "static:static_sls")
    prompts = [f"Static batch {i} of a sliced story" for i in range(3)]
    streams = [ex.submit(build_request(endless, p, max_tokens=10)) for p in prompts]
    results = await asyncio.gather(*(s.collect() for s in streams))
    for p, chunks in zip(prompts, results, strict=True):
        assert ids(chunks) == greedy_no_eos(endless, p, 10)
    assert (ex.core.requeues > 0) == recompute and ex.preemptions == 0
    await eventually(lambda: ex.load_snapshot().kv_blocks_used == 0, 5, "all blocks back")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        # found by fuzzing: 2**32-1 built 4e9 sequence names and the engine was OOM-killed
        ({"batch_sizes": [2**32 - 1]}, "batch_sizes"),
        ({"batch_sizes": [0]}, "batch_sizes"),
        ({"input_lengths": [1] * 1000}, "input_lengths"),  # 1000 x 4 points: hours of worker time
        ({"context_lengths": [2**32 - 1]}, "context_lengths"),
        ({"repeats": 2**32 - 1}, "repeats"),
        ({"repeats": 0}, "repeats"),
    ],
)
def test_profile_refuses_unbounded_sweeps_naming_the_field(make_executor, llama, kwargs, field):
    ex = make_executor()
    with pytest.raises(ValueError, match=f"^{field}: "):
        profiling.profile(ex, llama.name, **kwargs)
    assert ex.load_snapshot().kv_blocks_used == 0
