"""Prefix caching keyed by the request's ``prefix_key``: requests of LoRA adapters of one base model
share the base's KV pool but never a cached block; requests of one adapter do."""

from __future__ import annotations

from llmfleet.engine_core import CoreRequest, EngineCore, EngineLimits
from llmfleet.kvblocks import BlockAllocator, KvShape, prefix_block_hashes
from llmfleet.policies.request import Fcfs, SchedRequest

SHAPE = KvShape(num_layers=1, num_kv_heads=1, head_dim=4)  # 32 B/token
T = 4  # tokens per block
PROMPT = list(range(100, 113))  # three full blocks and one token


def make_core() -> EngineCore:
    alloc = BlockAllocator(64, 32 * T, watermark=0.0)
    alloc.register_model("base", SHAPE)
    core = EngineCore(Fcfs(), alloc, EngineLimits())
    core.add_model("base")
    return core


def req(rid: str, key: str | None) -> CoreRequest:
    sched = SchedRequest(rid, "s", "base", 0.0, len(PROMPT), 2)
    return CoreRequest(sched, len(PROMPT), 2, prompt_ids=PROMPT, prefix_key=key)


def cached_tokens(core: EngineCore, r: CoreRequest, now: float) -> int:
    """Serve ``r`` to its end; the tokens its prefill took from the cache."""
    core.add(r, now)
    first = None
    while core.has_work():
        plan = core.schedule(now)
        assert plan is not None
        first = plan.cached_tokens if first is None else first
        core.complete(plan, now, 0.01, finished=[x for x in plan.members if x.produced + 1 >= x.max_tokens])
    assert first is not None
    return first


def test_adapters_of_one_base_never_share_a_cached_block() -> None:
    core = make_core()
    assert cached_tokens(core, req("a1", "chat-lora"), 0.0) == 0
    assert cached_tokens(core, req("b1", "code-lora"), 1.0) == 0  # same base, same prompt: another key
    assert cached_tokens(core, req("base1", None), 2.0) == 0  # the base is keyed by its own name
    assert cached_tokens(core, req("a2", "chat-lora"), 3.0) == 12  # one adapter's requests share
    assert cached_tokens(core, req("base2", None), 4.0) == 12


def test_the_hash_chain_is_the_adapters_as_a_dispatcher_computes_it() -> None:
    r = req("a", "chat-lora")
    assert r.prefix_key == "chat-lora" and r.model == "base"
    assert r.block_hashes(T) == prefix_block_hashes("chat-lora", PROMPT, T)
    assert req("b", None).block_hashes(T) == prefix_block_hashes("base", PROMPT, T)
