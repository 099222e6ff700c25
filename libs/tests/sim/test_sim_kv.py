"""KV accounting matches the kvblocks arithmetic (merged blocks, ceil(tokens / T_m) per sequence)."""

from __future__ import annotations

import math

import pytest
from llmfleet.costmodel import hardware, model_arch
from llmfleet.policies.request import Fcfs
from llmfleet.sim.instance import SimInstance
from llmfleet.sim.memory import activation_bytes, pool_layout
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.spec import EngineSettings
from llmfleet.workload import WorkloadRequest as W

A100 = hardware("A100-80GB")


def make_instance(tiny, models=("llama2-7b",), engine=None, fast_forward=False):
    archs = {m: model_arch(m) for m in models}
    spec = tiny.spec(engine)
    book = tiny.book(spec)
    for m in models:
        book.pin(m, 1, tiny.linear)
    return SimInstance(
        "x", tuple(models), 1, A100, archs, engine or EngineSettings(), book, Fcfs(), fast_forward
    )


def fail(r, why):
    raise AssertionError(f"{r.rec.request_id} failed: {why}")


def admit(inst, rid, model, prompt, out, now=0.0):
    rec = RequestRecord(rid, "s", model, now, prompt, out)
    inst.admit(rec, 4096, now)
    return rec


def test_blocks_after_prefill_and_each_decode(tiny):
    inst = make_instance(tiny, engine=EngineSettings(kv_bytes=100 * tiny.block_bytes, watermark=0.0))
    assert inst.tpb == {"llama2-7b": 16} and inst.alloc.num_blocks == 100
    rec = admit(inst, "a", "llama2-7b", 100, 20)
    end = inst.start(0.0, fail)
    assert end == pytest.approx(tiny.pre(100))
    assert inst.alloc.used_blocks == math.ceil(100 / 16) == 7  # allocated at the prefill's start
    inst.finish_work(end)
    assert rec.produced == 1 and inst.alloc.num_tokens("a") == 100
    seen = []
    t = end
    while rec.finish_s is None:
        t = inst.start(t, fail)
        seen.append((inst.alloc.num_tokens("a"), inst.alloc.used_blocks))
        inst.finish_work(t)
    # decode i appends slot 100 + i − 1 (the previous token's K/V): 101 … 119 tokens
    assert [n for n, _ in seen] == list(range(101, 120))
    assert all(b == math.ceil(n / 16) for n, b in seen)
    assert seen[11] == (112, 7) and seen[12] == (113, 8)
    assert inst.alloc.used_blocks == 0 and rec.produced == 20


def test_merged_blocks_two_models(tiny):
    """A llama2-7b block is 16 of its tokens = 8 MiB; llama3-8b (128 KiB/token) fits 64 in it."""
    inst = make_instance(
        tiny,
        models=("llama2-7b", "llama3-8b"),
        engine=EngineSettings(kv_bytes=50 * tiny.block_bytes, watermark=0.0),
    )
    assert inst.layout.block_bytes == 16 * 524_288
    assert inst.tpb == {"llama2-7b": 16, "llama3-8b": 64}
    admit(inst, "a", "llama3-8b", 100, 3, now=0.0)
    admit(inst, "b", "llama2-7b", 100, 3, now=0.01)
    c = admit(inst, "c", "llama3-8b", 100, 10, now=0.02)
    # FCFS: llama3-8b holds the oldest request → a and c prefill together: 2 × ceil(100 / 64) blocks
    t = inst.start(0.0, fail)
    assert inst.alloc.used_blocks == 2 * 2 and "b" not in inst.alloc
    inst.finish_work(t)
    while "a" in inst.alloc:  # two decodes of {a, c}; a is then done
        t = inst.start(t, fail)
        inst.finish_work(t)
    # now b (0.01) is older than c (0.02): llama2-7b's prefill runs while c keeps its KV
    t = inst.start(t, fail)
    assert inst.alloc.num_tokens("b") == 100 and inst.alloc.num_tokens("c") == 102 and c.produced == 3
    assert inst.alloc.used_blocks == math.ceil(100 / 16) + math.ceil(102 / 64) == 9
    stats = inst.alloc.stats()
    assert stats.models["llama2-7b"].blocks == 7 and stats.models["llama3-8b"].blocks == 2


def test_kv_mid_run_through_a_hook(tiny):
    """A hook sees the live pool: ceil(context / 16) blocks for the one running request."""
    sim = tiny.sim(engine=EngineSettings(kv_bytes=100 * tiny.block_bytes, watermark=0.0), fast_forward=False)
    seen = []
    sim.every(0.1, lambda s, now: seen.append(s.instances["i0"].alloc.used_blocks))
    sim.run([W("a", 0.0, 100, 20, "s")])
    # t = 0.1: prefill in flight (7 blocks); 0.2: still prefill (ends 0.21); 0.3: decode ~5 → ceil(105/16)=7
    assert seen[0] == 7 and seen[1] == 7
    assert all(b in (7, 8) for b in seen[:-1]) and seen[-1] == 0


def test_pool_size_from_memory(tiny):
    """Without kv_bytes: tp · mem · fraction − weights − activation, in blocks of 16 llama2-7b tokens."""
    eng = EngineSettings()
    arch = model_arch("llama2-7b")
    layout = pool_layout(A100, 1, [arch], eng)
    act = eng.max_prefill_tokens * (4 * 4096 + 2 * 11008) * 2 + eng.max_batch_requests * 32000 * 4
    assert activation_bytes(arch, eng) == act
    assert layout.kv_bytes == int(A100.mem_bytes * 0.9) - arch.weight_bytes - act
    assert layout.num_blocks == layout.kv_bytes // (16 * 524_288)
    two = pool_layout(A100, 2, [arch], eng)
    assert two.kv_bytes - layout.kv_bytes == pytest.approx(A100.mem_bytes * 0.9, abs=2)
    inst = make_instance(tiny)
    assert inst.alloc.num_blocks == layout.num_blocks
    assert inst.alloc.watermark_blocks == int(0.01 * layout.num_blocks)
    assert inst.kv_capacity_bytes == layout.num_blocks * layout.block_bytes
