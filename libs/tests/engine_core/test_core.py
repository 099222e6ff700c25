"""EngineCore unit tests: the request table, queues, KV and policy calls, without any driver; the waiting
queue's running sum of its prompts' KV blocks stays the sum a scan would give through every way a
request enters or leaves it."""

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


def step(core: EngineCore, now: float, finish_at: int | None = None):
    """Schedule and complete one iteration; members whose output reaches ``finish_at`` (default their
    cap) finish."""
    plan = core.schedule(now)
    assert plan is not None
    done = [r for r in plan.members if r.produced + 1 >= (finish_at or r.max_tokens)]
    return plan, core.complete(plan, now + 0.01, 0.01, finished=done)


def test_prefill_then_decodes_then_finish_frees_the_kv():
    core = make_core()
    core.add(req("a", prompt=6, out=3), 0.0)
    plan, res = step(core, 0.0)
    assert plan.prefills and plan.prefill_tokens == 6 and core.alloc.num_tokens("a") == 6
    assert core.requests["a"].kv_tokens == 6 and not res.finished
    plan, _ = step(core, 0.1)
    assert plan.decodes == 1 and plan.context_tokens == 7 and core.alloc.num_tokens("a") == 7
    _, res = step(core, 0.2)
    assert [r.request_id for r in res.finished] == ["a"] and core.alloc.used_blocks == 0
    assert not core.requests and not core.has_work()


def test_admission_room_and_batch_limit_are_separate():
    core = make_core(max_running=2, max_batch_requests=3)
    for rid in "abc":
        core.add(req(rid), 0.0)
    plan, _ = step(core, 0.0)
    assert plan.request_ids == ["a", "b"] and "c" in core.waiting  # room for two KV holders only
    assert [s.request_id for s in plan.waiting_seen] == ["a", "b"]  # c was not even shown
    one = make_core(max_running=8, max_batch_requests=1)
    for rid in "ab":
        one.add(req(rid), 0.0)
    plan, _ = step(one, 0.0)
    assert plan.request_ids == ["a"]  # one request per iteration


def test_preemption_folds_output_and_requeues():
    core = make_core(blocks=4, max_running=4)  # 16 tokens of KV
    core.add(req("a", prompt=7, out=20), 0.0)
    core.add(req("b", prompt=7, out=20, t=0.001), 0.0)
    step(core, 0.0)  # both prefilled: 2 + 2 blocks (7 tokens each)
    step(core, 0.1)  # the 8th token of each still fits its second block
    plan, _ = step(core, 0.2)  # the 9th needs a third block each: b (the latest) is preempted
    assert [r.request_id for r in plan.preempted] == ["b"] and core.preemptions == 1
    b = core.requests["b"]
    assert b.sched.phase == "prefill" and b.sched.prompt_tokens == 9 and b.sched.max_new_tokens == 18
    assert "b" not in core.alloc and b.preemptions == 1


def test_drop_of_an_in_flight_member_frees_after_complete():
    core = make_core()
    core.add(req("a"), 0.0)
    plan = core.schedule(0.0)
    assert core.remove("a") is None  # in flight: cannot be moved
    assert core.drop("a") is not None and "a" in core.alloc  # still being written
    core.complete(plan, 0.01, 0.01)
    assert "a" not in core.alloc and not core.requests


def test_paused_requests_are_not_scheduled():
    core = make_core()
    core.add(req("a"), 0.0)
    core.pause("a")
    assert not core.has_work() and core.schedule(0.0) is None
    assert core.resume("a") and core.schedule(0.0) is not None


def test_land_with_kv_or_to_reprefill():
    core = make_core(blocks=3)
    r = req("a", prompt=5, out=8)
    r.sched.generated, r.sched.phase = 2, "decode"
    assert core.land(r, 0.0, kv_tokens=r.kv_tokens) and core.alloc.num_tokens("a") == 6
    big = req("b", prompt=30, out=8)
    big.sched.generated, big.sched.phase = 3, "decode"
    assert not core.land(big, 0.0, kv_tokens=big.kv_tokens)  # no room: re-prefill prompt + output
    assert big.sched.prompt_tokens == 33 and big.sched.max_new_tokens == 5 and "b" in core.waiting


def test_stuck_requests_fail_loudly():
    core = make_core(blocks=2)
    core.add(req("huge", prompt=40), 0.0)
    assert core.schedule(0.0) is None
    [(r, why)] = core.drain_failed()
    assert r.request_id == "huge" and "needs 11 KV blocks" in why and not core.requests


def test_a_second_schedule_before_complete_is_an_error():
    core = make_core()
    core.add(req("a"), 0.0)
    core.schedule(0.0)
    with pytest.raises(RuntimeError, match="in flight"):
        core.schedule(0.0)


def test_static_mode_pads_rows_and_requeues_at_the_slice_end():
    core = make_core(StaticSls(StaticSlsOptions(batch_size=2, max_iterations=3)))
    assert core.static
    core.add(req("a", prompt=3, out=10), 0.0)
    core.add(req("b", prompt=9, out=2, t=0.001), 0.0)
    plan, _ = step(core, 0.0)
    assert plan.static and plan.padded_len == 9 and plan.prefill_tokens == 18
    assert core.alloc.num_tokens("a") == 9  # padded to the longest prompt
    plan, res = step(core, 0.1)  # b reaches its 2 tokens; it holds its padded row to the batch end
    assert [r.request_id for r in res.finished] == ["b"] and "b" in core.alloc
    plan, res = step(core, 0.2)  # third iteration: the slice ends
    assert [r.request_id for r in plan.members] == ["a"] and len(plan.rows) == 2 and plan.decodes == 2
    assert [r.request_id for r in res.requeued] == ["a"] and core.requeues == 1
    assert core.alloc.used_blocks == 0 and core.requests["a"].sched.prompt_tokens == 6


def test_static_oom_ends_the_batch_at_completion():
    core = make_core(StaticSls(StaticSlsOptions(batch_size=2)), blocks=6)  # 24 tokens
    core.add(req("a", prompt=11, out=10), 0.0)
    core.add(req("b", prompt=11, out=10, t=0.001), 0.0)
    plan, res = step(core, 0.0)  # 2 rows x 11 tokens in 6 blocks
    assert plan.padded_len == 11
    assert not res.requeued
    _, res = step(core, 0.1)  # 12 tokens each: the pool is full, no row can grow: the batch ends
    assert sorted(r.request_id for r in res.requeued) == ["a", "b"] and core.alloc.used_blocks == 0


# ----------------------------------------------------------------------- the waiting queue's KV sum
def scanned(core: EngineCore) -> int:
    return sum(-(-r.sched.prompt_tokens // 4) for r in core.waiting.values())


def step_summed(core: EngineCore, now: float) -> None:
    """One step; the waiting queue's running sum is still the scan's."""
    step(core, now)
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
        step_summed(core, 0.1 * i)
    b = core.requests["b"]
    assert core.preemptions >= 1 and "b" in core.waiting and b.sched.prompt_tokens > 7
    assert core.waiting.prompt_blocks == scanned(core) > 4  # b rejoined with its output folded in


def test_a_static_batch_end_landings_drops_and_failures_keep_the_sum():
    core = make_core(StaticSls(StaticSlsOptions(batch_size=2, max_iterations=3)))
    core.add(req("a", prompt=3, out=10), 0.0)
    core.add(req("b", prompt=9, out=2, t=0.001), 0.0)
    for i in range(3):  # the slice ends: a goes back to waiting with 6 tokens
        step_summed(core, 0.1 * i)
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
