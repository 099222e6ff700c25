"""Prefix caching in the native engine: greedy outputs are those of HF ``generate`` and of the engine
with caching off, prompts that share a prefix compute only what follows it, and the cache's blocks
and counters add up (metrics, load snapshot, unloading)."""

from __future__ import annotations

import asyncio
import dataclasses

import torch
from llmfleet.kvblocks import prefix_block_hashes
from llmfleet.metrics.engine import EngineMetrics
from llmfleet.testing import eventually
from llmfleet_engine.executor import Executor
from llmfleet_engine.models import LoadedModel
from llmfleet_engine.servicer import chunk_to_proto, snapshot_to_proto
from llmfleet_engine.validation import build_request
from prometheus_client import CollectorRegistry, generate_latest
from test_paged_engine import migrate_in_process

BLOCK = 4096  # 8 tokens of the tiny llama per block


def shared_prefix_prompts(vocab: int) -> list[list[int]]:
    """Prompts over a common 21-token prefix (ending mid-block), cut at and around block boundaries,
    with suffixes of their own, and one prompt that is exactly whole blocks of the prefix."""
    prefix = [(7 * i + 3) % (vocab - 10) + 5 for i in range(21)]
    out = [prefix]
    for k, cut in enumerate((21, 16, 17, 8, 21, 23, 13)):
        tail = [(11 * j + 5 * k + 1) % (vocab - 10) + 5 for j in range(3 + 2 * k)]
        out.append(prefix[:cut] + tail)
    out.append(prefix[:16])  # two whole cached blocks: the last prompt token is still computed
    out.append([(5 * i + 2) % (vocab - 10) + 5 for i in range(19)])  # shares nothing
    return out


async def serve(ex: Executor, model: LoadedModel, prompts: list[list[int]], n: int) -> list[list[int]]:
    """The prompts' greedy outputs: the first alone (it fills the cache), then the rest at once."""

    async def one(i: int, ids: list[int]) -> list[int]:
        req = build_request(model, "x", request_id=f"p{i}", max_tokens=n)
        req = dataclasses.replace(req, prompt_token_ids=tuple(ids))
        chunks = await ex.submit(req).collect()
        return [t for c in chunks for t in c.token_ids]

    first = await one(0, prompts[0])
    rest = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts[1:], 1)))
    return [first, *rest]


async def test_greedy_outputs_match_hf_and_caching_off(make_executor, llama, hf_greedy):
    prompts = shared_prefix_prompts(llama.vocab_size)
    on = make_executor(block_bytes=BLOCK, max_batch_requests=8)
    off = make_executor(block_bytes=BLOCK, max_batch_requests=8, prefix_caching=False)
    cached = await serve(on, llama, prompts, 10)
    plain = await serve(off, llama, prompts, 10)
    assert cached == plain
    for ids, out in zip(prompts, cached, strict=True):
        assert out == hf_greedy(llama, ids, 10)
    t = on.host.tokens_per_block(llama.name)
    assert t == 8
    # every prompt after the first found the whole blocks it shares with the prefix cached (the
    # whole-block prompt all but its last block, so that its last token is computed)
    sent = sum(map(len, prompts))
    cuts = (21, 16, 17, 8, 21, 21, 13, 16)
    expected_hits = sum(min(c // t, (len(p) - 1) // t) * t for c, p in zip(cuts, prompts[1:-1], strict=True))
    assert (on.core.prefix_queries, on.core.prefix_hits) == (sent, expected_hits)
    assert (off.core.prefix_queries, off.core.prefix_hits) == (0, 0)


async def test_longest_prefix_admission_keeps_greedy_outputs(make_executor, llama):
    """Admitting the most cached prompts first changes the order, not what any request generates."""
    prompts = shared_prefix_prompts(llama.vocab_size)
    fcfs = make_executor(block_bytes=BLOCK, max_batch_requests=2)
    lpm = make_executor(block_bytes=BLOCK, max_batch_requests=2, policy="longest_prefix")
    assert lpm.core.prefix_aware
    assert await serve(lpm, llama, prompts, 10) == await serve(fcfs, llama, prompts, 10)
    assert lpm.core.prefix_hits >= fcfs.core.prefix_hits > 0


async def test_a_repeated_prompt_computes_only_its_last_tokens(make_executor, llama):
    ex = make_executor(block_bytes=BLOCK)
    registry = CollectorRegistry()
    ex.attach_metrics(EngineMetrics(registry))
    ids = [(3 * i + 1) % 200 + 5 for i in range(50)]  # 6 full blocks and 2 tokens
    first, second = await serve(ex, llama, [ids, ids], 4)
    assert first == second
    assert (ex.core.prefix_queries, ex.core.prefix_hits) == (100, 48)
    text = generate_latest(registry).decode()
    assert f'vllm:prefix_cache_queries_total{{model_name="{llama.name}"}} 100.0' in text
    assert f'vllm:prefix_cache_hits_total{{model_name="{llama.name}"}} 48.0' in text
    cache = ex.load_snapshot().prefix_cache
    assert cache is not None and (cache.queries, cache.hits) == (100, 48)
    # the prompt's full blocks, named by the hash chain over the model and its token ids, are cached
    hashes = prefix_block_hashes(llama.name, ids, ex.host.tokens_per_block(llama.name))
    assert len(hashes) == 6 and ex.allocator.match(hashes) == 6
    assert ex.allocator.match(prefix_block_hashes("another-model", ids, 8)) == 0
    assert cache.blocks == cache.idle_blocks == 6  # the requests finished: idle, still cached
    wire = snapshot_to_proto(ex.load_snapshot(), "e0").prefix_cache
    assert (wire.blocks, wire.idle_blocks, wire.queries, wire.hits) == (6, 6, 100, 48)
    await eventually(lambda: ex.load_snapshot().kv_blocks_used == 0, 5, "idle cached blocks are free")


async def test_the_final_usage_counts_the_prompt_tokens_found_cached(make_executor, llama):
    """vLLM's ``num_cached_tokens``: what the request's prefill took from the cache, per request."""
    ex = make_executor(block_bytes=BLOCK)
    ids = [(5 * i + 2) % 200 + 5 for i in range(50)]  # 6 full blocks and 2 tokens
    finals = []
    for i in range(2):
        req = dataclasses.replace(
            build_request(llama, "x", request_id=f"u{i}", max_tokens=2), prompt_token_ids=tuple(ids)
        )
        finals.append((await ex.submit(req).collect())[-1])
    assert [f.usage.prompt_tokens for f in finals if f.usage] == [50, 50]
    assert [f.usage.cached_tokens for f in finals if f.usage] == [0, 48]
    assert chunk_to_proto(finals[1], "e0").usage.cached_tokens == 48


async def test_the_next_turn_starts_on_the_previous_answer_s_cached_blocks(make_executor, llama, hf_greedy):
    """A conversation: turn 2 resends turn 1's prompt and greedy answer, then a new message. Turn 1's
    output blocks were cached when it finished, so turn 2 computes only what follows them; its greedy
    output is HF's and that of the engine with caching off."""
    on = make_executor(block_bytes=BLOCK)
    off = make_executor(block_bytes=BLOCK, prefix_caching=False)
    turn1 = [(3 * i + 1) % 200 + 5 for i in range(13)]  # 1 full block and 5 tokens
    (answer,) = await serve(on, llama, [turn1], 12)
    assert answer == (await serve(off, llama, [turn1], 12))[0]
    turn2 = [*turn1, *answer, 17, 18, 19]  # 28 tokens
    queries, hits = on.core.prefix_queries, on.core.prefix_hits
    (out,) = await serve(on, llama, [turn2], 6)
    # turn 1 had K/V for 13 + 12 - 1 = 24 tokens when it finished: 3 full blocks, 1 of them prompt only
    assert (on.core.prefix_queries - queries, on.core.prefix_hits - hits) == (28, 24)
    assert out == (await serve(off, llama, [turn2], 6))[0] == hf_greedy(llama, turn2, 6)


async def test_unloading_a_model_drops_its_cached_blocks(make_executor, llama, qwen2):
    ex = make_executor(block_bytes=BLOCK)
    ids = [(3 * i + 1) % 200 + 5 for i in range(40)]
    await serve(ex, qwen2, [ids], 2)
    await serve(ex, llama, [ids], 2)
    before = ex.load_snapshot().prefix_cache
    assert before is not None and before.blocks > 0
    stats = ex.allocator.stats()
    assert stats.models[qwen2.name].cached_blocks > 0 and stats.models[llama.name].cached_blocks > 0
    await asyncio.to_thread(ex.host.unload, qwen2.name)
    stats = ex.allocator.stats()
    assert qwen2.name not in stats.models and stats.models[llama.name].cached_blocks > 0
    after = ex.load_snapshot().prefix_cache
    assert after is not None and after.blocks == stats.cached_blocks


async def test_caching_off_reports_no_cache(make_executor, llama):
    ex = make_executor(block_bytes=BLOCK, prefix_caching=False)
    ids = [(3 * i + 1) % 200 + 5 for i in range(30)]
    await serve(ex, llama, [ids, ids], 2)
    assert ex.load_snapshot().prefix_cache is None
    assert not snapshot_to_proto(ex.load_snapshot(), "e0").HasField("prefix_cache")
    assert ex.allocator.prefix_cache_stats().blocks == 0


def greedy_ids(model: LoadedModel, prompt: list[int], n: int) -> list[int]:
    """Reference continuation ignoring EOS: full-sequence HF forwards, argmax each step."""
    seq, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(n):
            token = int(torch.argmax(model.model(torch.tensor([seq])).logits[0, -1]))
            out.append(token)
            seq.append(token)
    return out


async def test_a_request_on_cached_blocks_migrates_with_its_whole_kv(make_executor, endless):
    src = make_executor(block_bytes=BLOCK)
    dst = make_executor(block_bytes=16 * 1024)  # another block size: the KV moves token by token
    prefix = [(3 * i + 1) % 200 + 5 for i in range(27)]
    await serve(src, endless, [prefix], 2)  # its blocks are now cached
    prompt = [*prefix, 9, 8, 7, 6, 5]
    req = build_request(endless, "x", request_id="mig", max_tokens=40)
    stream = src.submit(dataclasses.replace(req, prompt_token_ids=tuple(prompt)))
    head = [await stream.__anext__() for _ in range(8)]
    assert src.core.prefix_hits == 24  # three blocks of the prefix were taken from the cache
    moved = await migrate_in_process(src, dst, "mig", chunk_tokens=5)
    rest = [c async for c in stream]
    attached = dst.attach("mig")
    assert attached is not None
    tail = await attached.collect()
    out = [t for c in head + rest + tail for t in c.token_ids]
    assert out == greedy_ids(endless, prompt, 40) and moved >= len(prompt) + 7
    # the migrated-in KV is named at the destination too: 32 + 40 - 1 tokens, two full blocks of 32
    assert dst.allocator.prefix_cache_stats().blocks == 2
    await eventually(lambda: src.load_snapshot().kv_blocks_used == 0, 5, "source blocks freed")
    assert src.allocator.stats().cached_blocks >= 3  # the prefix stays cached at the source


async def test_a_request_arriving_mid_decode_starts_on_its_output_blocks(make_executor, endless):
    """a's blocks are named as decoding fills them: b, sent while a still decodes, resends a's prompt
    and its first 19 output tokens (4 full blocks of 8) and takes all four from the cache, a's output
    blocks included; both greedy outputs are those of the engine with caching off (and HF's)."""
    on = make_executor(block_bytes=BLOCK)
    off = make_executor(block_bytes=BLOCK, prefix_caching=False)
    prompt = [(3 * i + 1) % 200 + 5 for i in range(13)]  # 1 full block and 5 tokens
    req = build_request(endless, "x", request_id="a", max_tokens=40)
    stream = on.submit(dataclasses.replace(req, prompt_token_ids=tuple(prompt)))
    head: list[int] = []
    while len(head) < 20:  # a's K/V then holds at least 13 + 20 - 1 = 32 tokens: 4 full blocks
        head += (await stream.__anext__()).token_ids
    # a stays running, its KV held, until resumed
    held = await asyncio.to_thread(on.migration.pause_request, "a")
    assert held.num_tokens >= 32 and "a" in on.core.running
    hits = on.core.prefix_hits
    follow = [*prompt, *held.generated_token_ids[:19], 17, 18, 19]  # 35 tokens
    (out,) = await serve(on, endless, [follow], 6)
    assert on.core.prefix_hits - hits == 32
    assert on.migration.resume_request("a")
    rest = [t async for c in stream for t in c.token_ids]
    assert [*head, *rest] == (await serve(off, endless, [prompt], 40))[0] == greedy_ids(endless, prompt, 40)
    assert out == (await serve(off, endless, [follow], 6))[0] == greedy_ids(endless, follow, 6)
