"""The waiting queue's running sum of its prompts' KV blocks stays the sum a scan would give through
every way a request enters or leaves it: arrival, admission, preemption, a static batch's end, a
landing without KV, a drop, a stuck request's failure."""

from __future__ import annotations

import pytest
from llmfleet.engine_core import CoreRequest, EngineCore, EngineLimits
from llmfleet.engine_core.waiting import WaitingQueue
from llmfleet.kvblocks import BlockAllocator, KvShape
from llmfleet.policies.batching import StaticSls, StaticSlsOptions
from llmfleet.policies.request import Fcfs, SchedRequest

SHAPE = KvShape(num_layers=1, num_kv_heads=1, head_dim=4)  # 32 B/token
BLOCK = 32 * 4  # 4 tokens per block


def make_core(policy=None, blocks: int = 64, **limits) -> EngineCore:
    alloc = BlockAllocator(blocks, BLOCK, watermark=0.0)
    alloc.register_model("m", SHAPE)
    core = EngineCore(policy or Fcfs(), alloc, EngineLimits(**limits))
    core.add_model("m")
    return core


def req(rid: str, prompt: int = 6, out: int = 4, t: float = 0.0) -> CoreRequest:
    return CoreRequest(SchedRequest(rid, "s", "m", t, prompt, out), prompt, out)


def scanned(core: EngineCore) -> int:
    return sum(-(-r.sched.prompt_tokens // 4) for r in core.waiting.values())


def step(core: EngineCore, now: float) -> None:
    plan = core.schedule(now)
    assert plan is not None
    done = [r for r in plan.members if r.produced + 1 >= r.max_tokens]
    core.complete(plan, now + 0.01, 0.01, finished=done)
    assert core.waiting.prompt_blocks == scanned(core)


def test_the_queue_reads_like_a_mapping_and_sums_its_blocks():
    q = WaitingQueue()
    a, b = req("a", prompt=5), req("b", prompt=9)
    q.add(a, 2)
    q.add(b, 3)
    assert list(q) == ["a", "b"] and q["b"] is b and q.get("x") is None and len(q) == 2
    assert q.prompt_blocks == 5 and list(q.values()) == [a, b] and q.keys() == {"a", "b"}
    with pytest.raises(ValueError, match="already waiting"):
        q.add(a, 2)
    with pytest.raises(ValueError, match="blocks must be >= 0"):
        q.add(req("c"), -1)
    assert q.pop("a") is a and q.pop("a") is None and q.prompt_blocks == 3 and "a" not in q
    assert q.pop("b") is b and not q and q.prompt_blocks == 0


def test_arrivals_admissions_and_preemptions_keep_the_sum():
    core = make_core(blocks=4, max_running=4)  # 16 tokens of KV: the second decode block preempts
    core.add(req("a", prompt=7, out=20), 0.0)
    core.add(req("b", prompt=7, out=20, t=0.001), 0.0)
    core.add(req("c", prompt=13, out=2, t=0.002), 0.0)
    assert core.waiting.prompt_blocks == 2 + 2 + 4 == scanned(core)
    for i in range(4):
        step(core, 0.1 * i)
    b = core.requests["b"]
    assert core.preemptions >= 1 and "b" in core.waiting and b.sched.prompt_tokens > 7
    assert core.waiting.prompt_blocks == scanned(core) > 4  # b rejoined with its output folded in


def test_a_static_batch_end_landings_drops_and_failures_keep_the_sum():
    core = make_core(StaticSls(StaticSlsOptions(batch_size=2, max_iterations=3)))
    core.add(req("a", prompt=3, out=10), 0.0)
    core.add(req("b", prompt=9, out=2, t=0.001), 0.0)
    for i in range(3):  # the slice ends: a goes back to waiting with 6 tokens
        step(core, 0.1 * i)
    assert core.waiting.keys() == {"a"} and core.waiting.prompt_blocks == 2

    cont = make_core(blocks=3)
    big = req("big", prompt=30, out=8)
    big.sched.generated, big.sched.phase = 3, "decode"
    assert not cont.land(big, 0.0, kv_tokens=big.kv_tokens)  # no room: it waits to re-prefill 33
    assert cont.waiting.prompt_blocks == 9 == scanned(cont)
    cont.add(req("x", prompt=5), 0.0)
    assert cont.drop("x") is not None and cont.waiting.prompt_blocks == 9
    assert cont.schedule(0.0) is None  # 9 blocks can never fit 3: it fails
    [(r, _)] = cont.drain_failed()
    assert r.request_id == "big" and not cont.waiting and cont.waiting.prompt_blocks == 0
