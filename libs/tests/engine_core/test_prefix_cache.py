"""The engine core's prefix caching: a prefill computes only the tokens after the cached blocks of its
prompt, its own full prompt blocks are cached once computed, and caching never makes a request wait."""

from __future__ import annotations

from llmfleet.engine_core import CoreRequest, EngineCore, EngineLimits
from llmfleet.kvblocks import BlockAllocator, KvShape
from llmfleet.policies.request import Fcfs, SchedRequest

SHAPE = KvShape(num_layers=1, num_kv_heads=1, head_dim=4)  # 32 B/token
T = 4  # tokens per block


def make_core(blocks: int = 64, **limits) -> EngineCore:
    alloc = BlockAllocator(blocks, 32 * T, watermark=0.0)
    alloc.register_model("m", SHAPE)
    core = EngineCore(Fcfs(), alloc, EngineLimits(**limits))
    core.add_model("m")
    return core


def req(rid: str, ids: list[int] | None, out: int = 2, n: int | None = None) -> CoreRequest:
    prompt = len(ids) if ids is not None else n or 0
    return CoreRequest(SchedRequest(rid, "s", "m", 0.0, prompt, out), prompt, out, prompt_ids=ids)


def run(core: EngineCore, r: CoreRequest, now: float) -> list:
    """Serve ``r`` alone to its end; the plans of its steps."""
    core.add(r, now)
    plans = []
    while core.has_work():
        plan = core.schedule(now)
        assert plan is not None
        plans.append(plan)
        done = [x for x in plan.members if x.produced + 1 >= x.max_tokens]
        core.complete(plan, now, 0.01, finished=done)
    return plans


PREFIX = list(range(100, 110))  # 10 tokens: two full blocks and half of a third


def test_a_prefill_computes_only_what_follows_the_cached_blocks():
    core = make_core()
    first = run(core, req("a", [*PREFIX, 1, 2, 3]), 0.0)[0]
    assert (first.prefill_tokens, first.prefill_sq, first.cached_tokens) == (13, 169, 0)
    second = run(core, req("b", [*PREFIX, 7, 8, 9, 10, 11]), 1.0)[0]
    assert second.cached_tokens == 8 and second.prefills[0].cached == 8
    assert (second.prefill_tokens, second.prefill_sq) == (7, 7 * (7 + 16))
    assert (core.prefix_queries, core.prefix_hits) == (28, 8)
    # a prompt of whole cached blocks still computes its last token (its last block is recomputed)
    third = run(core, req("c", PREFIX[:8]), 2.0)[0]
    assert (third.cached_tokens, third.prefill_tokens) == (4, 4)


def test_caching_off_or_unknown_ids_compute_every_prompt_token():
    off = make_core(prefix_caching=False)
    run(off, req("a", PREFIX), 0.0)
    plan = run(off, req("b", PREFIX), 1.0)[0]
    assert (plan.prefill_tokens, plan.cached_tokens, off.prefix_queries) == (10, 0, 0)
    on = make_core()
    run(on, req("a", None, n=10), 0.0)
    assert run(on, req("b", None, n=10), 1.0)[0].prefill_tokens == 10
    assert on.alloc.prefix_cache_stats().blocks == 0


def test_a_failed_step_caches_nothing():
    core = make_core()
    core.add(req("a", PREFIX), 0.0)
    plan = core.schedule(0.0)
    assert plan is not None
    core.complete(plan, 0.1, 0.0, produced=[0])  # the forward failed: no K/V was written
    core.drop("a")
    assert core.alloc.prefix_cache_stats().blocks == 0
    assert run(core, req("b", PREFIX), 1.0)[0].cached_tokens == 0


def test_idle_cached_blocks_never_make_a_request_wait():
    core = make_core(blocks=8)
    run(core, req("a", PREFIX + list(range(18))), 0.0)  # 28 tokens: 7 blocks, all cached and idle
    assert core.alloc.prefix_cache_stats().idle_blocks == 7 and core.alloc.free_blocks == 8
    plans = run(core, req("b", list(range(500, 528))), 1.0)  # shares nothing, needs the whole pool
    assert plans[0].prefill_tokens == 28 and not core.requests
    assert core.alloc.prefix_cache_stats().blocks == 7  # b's blocks replaced a's


def test_a_finished_request_caches_its_output_blocks_for_the_turn_that_resends_them():
    """a's prompt (6 tokens) and its 7 output tokens: 12 of them have K/V when it finishes (the last
    sampled token is never fed), three full blocks; the next turn resends prompt + answer + more."""
    core = make_core()
    answer = [50, 51, 52, 53, 54, 55, 56]
    a = req("a", PREFIX[:6], out=len(answer))
    a.output_ids = lambda: answer
    run(core, a, 0.0)
    assert core.alloc.prefix_cache_stats().blocks == 3  # prompt: 1 block; prompt + output: 3
    nxt = run(core, req("b", [*PREFIX[:6], *answer, 9, 9, 9]), 1.0)[0]
    assert nxt.cached_tokens == 12 and nxt.prefill_tokens == 4
    # without output ids (or with caching off) only the prompt's full block is cached
    plain = make_core()
    run(plain, req("a", PREFIX[:6], out=len(answer)), 0.0)
    assert run(plain, req("b", [*PREFIX[:6], *answer, 9, 9, 9]), 1.0)[0].cached_tokens == 4
    off = make_core(prefix_caching=False)
    b = req("a", PREFIX[:6], out=len(answer))
    b.output_ids = lambda: answer
    run(off, b, 0.0)
    assert off.alloc.prefix_cache_stats().blocks == 0


def step(core: EngineCore, now: float) -> list[CoreRequest]:
    """Run one step; the members that reached their ``max_tokens`` finish. Returns the plan's prefills."""
    plan = core.schedule(now)
    assert plan is not None
    done = [x for x in plan.members if x.produced + 1 >= x.max_tokens]
    core.complete(plan, now, 0.01, finished=done)
    return plan.prefills


def test_output_blocks_are_cached_as_decoding_fills_them():
    """a decodes; each block is named as soon as its last token's K/V is written, so b, which arrives
    while a still decodes and resends a's prompt and the answer so far, starts on a's output blocks."""
    core = make_core()
    answer = list(range(50, 62))
    a = req("a", PREFIX[:6], out=len(answer))
    a.output_ids = lambda: answer
    core.add(a, 0.0)
    for i in range(7):  # the prefill and six decodes
        step(core, 0.1 * i)
        assert core.alloc.prefix_cache_stats().blocks == a.kv_tokens // T
    assert a.kv_tokens == 12 and "a" in core.running  # prompt 6 + 7 sampled, the newest not fed yet
    b = req("b", [*PREFIX[:6], *answer[:6], 9, 9, 9])
    core.add(b, 1.0)
    (prefill,) = step(core, 1.0)
    assert prefill is b and b.cached == 12  # a's prompt block and its two filled output blocks
    # the three blocks are shared: they count once in the model's KV
    assert core.alloc.stats().models["m"].blocks == len(core.alloc.table("a").blocks) + 1
    assert core.alloc.table("b").blocks[:3] == core.alloc.table("a").blocks[:3]
    while core.has_work():
        step(core, 2.0)
    assert core.alloc.free_blocks == core.alloc.num_blocks


def test_naming_blocks_as_they_fill_survives_preemption():
    """A pool too small for both requests: the younger one is preempted (its KV freed, its named blocks
    left idle in the cache) and re-prefilled later; both finish and every block comes back."""
    core = make_core(blocks=7)
    outs = {"a": list(range(50, 66)), "b": list(range(70, 86))}
    for rid, prompt in (("a", PREFIX[:6]), ("b", PREFIX[:5])):
        r = req(rid, prompt, out=16)
        r.output_ids = lambda rid=rid: outs[rid]
        core.add(r, 0.0)
    while core.has_work():
        step(core, 0.0)
    assert core.preemptions > 0
    assert core.alloc.free_blocks == core.alloc.num_blocks
    assert core.alloc.stats().used_blocks == 0
