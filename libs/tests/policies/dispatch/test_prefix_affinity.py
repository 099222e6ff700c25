"""Prefix-affinity dispatch: affinity to the engine holding a prefix, a burst of one prefix spread by the
load book, the load bound, expiry, LRU eviction, session affinity, and its options."""

from __future__ import annotations

from collections import Counter

import pytest
from llmfleet.kvblocks.prefix import block_hash
from llmfleet.load.book import LoadBook, LoadReport
from llmfleet.policies.dispatch import (
    DispatchRequest,
    EngineCandidate,
    NoCandidate,
    PrefixAffinity,
    dispatch_needs,
    make_dispatch_policy,
)
from llmfleet.policies.dispatch.prefix_affinity import ExpectedBlocks, PrefixAffinityOptions, prompt_blocks

ENGINES = ("e0", "e1", "e2", "e3")
SYSTEM = " ".join(f"s{i}" for i in range(400))  # ~1,900 bytes: 7 full 256-byte chunks


def eng(eid: str, queued: int = 0, cap: int = 0) -> EngineCandidate:
    return EngineCandidate(eid, ("m",), running=queued, kv_capacity_bytes=cap)


def req(rid: str, prompt: str, t: float = 0.0, session: str = "", bpt: int = 0) -> DispatchRequest:
    return DispatchRequest(rid, "m", "chat", 0, 0.0, bpt, t, prompt=prompt, session=session)


def text(tag: str, words: int = 300) -> str:
    return " ".join(f"{tag}{i}" for i in range(words))


def test_blocks_are_a_chain_of_full_chunks_per_model():
    a = prompt_blocks("m", "x" * 1000, 256)
    assert len(a) == 3  # 1000 // 256: the partial chunk is not hashed
    assert prompt_blocks("m", "x" * 1000 + "tail", 256) == a  # same prefix, same chain
    b = prompt_blocks("m", "y" + "x" * 999, 256)
    assert not set(a) & set(b)  # a different first chunk changes every hash after it
    assert prompt_blocks("other", "x" * 1000, 256) != a  # two models never share a block
    assert prompt_blocks("m", "x" * 100_000, 256, max_blocks=5) == prompt_blocks("m", "x" * 1280, 256)
    # the KV pool's chain, the text's 8-byte words standing for token ids
    words = [int.from_bytes(b"x" * 8, "little", signed=True)] * 32
    assert a[0] == block_hash("m", None, words) and a[1] == block_hash("m", a[0], words)


def test_affinity_to_the_engine_holding_the_prefix():
    p = PrefixAffinity()
    cands = [eng(e) for e in ENGINES]
    first = p.choose("m", cands, request=req("r0", SYSTEM + text("a")))
    assert first == "e0"  # nothing held anywhere: least loaded, smallest id
    # the engine holding the prefix wins over idler ones while within the bound (least 0 + 4)
    busy = [eng("e0", 3), eng("e1"), eng("e2"), eng("e3")]
    assert p.choose("m", busy, request=req("r1", SYSTEM + text("b"), 1.0)) == "e0"
    # an unrelated prompt goes by load
    assert p.choose("m", busy, request=req("r2", text("z", 500), 2.0)) == "e1"
    # the longest held prefix wins: e1 now holds text z's chunks, e0 only the system prompt
    conv = SYSTEM + text("a") + text("turn2")
    assert p.choose("m", [eng(e) for e in ENGINES], request=req("r3", conv, 3.0)) == "e0"
    assert p.stats.requests == 4 and p.stats.matched_blocks > 0


def test_a_hot_engine_is_not_preferred_past_the_load_bound():
    p = PrefixAffinity(PrefixAffinityOptions(max_load_excess=2, max_load_ratio=1.5))
    p.choose("m", [eng(e) for e in ENGINES], request=req("r0", SYSTEM))
    # least 0: bound max(0 + 2, 0) = 2
    assert p.choose("m", [eng("e0", 2), eng("e1"), eng("e2")], request=req("r1", SYSTEM, 1)) == "e0"
    assert p.choose("m", [eng("e0", 3), eng("e1"), eng("e2")], request=req("r2", SYSTEM, 2)) == "e1"
    assert p.stats.over_bound == 1
    # least 10: bound max(12, 15) = 15
    q = PrefixAffinity(PrefixAffinityOptions(max_load_excess=2, max_load_ratio=1.5))
    q.choose("m", [eng("e0"), eng("e1", 5)], request=req("r0", SYSTEM))
    assert q.choose("m", [eng("e0", 15), eng("e1", 10)], request=req("r1", SYSTEM, 1)) == "e0"
    assert q.choose("m", [eng("e0", 16), eng("e1", 10)], request=req("r2", SYSTEM, 2)) == "e1"


def burst_shares(report_each: int | None) -> Counter[str]:
    """500 requests of one prefix over 4 engines through the load book, as the live scheduler
    dispatches them: every report stale (taken before the burst) unless ``report_each`` says how many
    dispatches pass between reports that count what was sent (requests never finish in a burst)."""
    p, book = PrefixAffinity(), LoadBook()
    for e in ENGINES:
        book.report(e, LoadReport())
    sent: Counter[str] = Counter()
    prompt = SYSTEM + text("q", 50)
    for i in range(500):
        if report_each and i and i % report_each == 0:
            for e in ENGINES:
                book.report(e, LoadReport(running=sent[e]))
        cands = [book.candidate(e, ("m",)) for e in ENGINES]
        chosen = p.choose("m", cands, request=req(f"r{i}", prompt, i * 1e-3))
        book.dispatched(chosen, f"r{i}")
        sent[chosen] += 1
    return sent


@pytest.mark.parametrize("report_each", [None, 20])
def test_a_burst_of_one_prefix_spreads_over_the_engines(report_each):
    sent = burst_shares(report_each)
    assert sum(sent.values()) == 500 and set(sent) == set(ENGINES)
    assert max(sent.values()) <= 250, sent  # no engine above 50% of the burst
    assert max(sent.values()) - min(sent.values()) <= 10, sent  # in fact spread by load


def test_expiry_forgets_what_was_not_used_for_ttl():
    p = PrefixAffinity(PrefixAffinityOptions(ttl_s=10.0))
    assert p.choose("m", [eng("e0"), eng("e1")], request=req("r0", SYSTEM, 0.0)) == "e0"
    loaded = [eng("e0", 2), eng("e1")]
    assert p.choose("m", loaded, request=req("r1", SYSTEM, 9.0)) == "e0"  # refreshed at t = 9
    assert p.choose("m", loaded, request=req("r2", SYSTEM, 18.5)) == "e0"  # 9.5 s old: still held
    assert p.choose("m", loaded, request=req("r3", SYSTEM, 29.0)) == "e1"  # 10.5 s old: gone, by load
    assert p.index.depths(prompt_blocks("m", SYSTEM), 29.0) == {"e1": 7}  # e0's entries dropped


def test_eviction_is_lru_per_engine_and_drops_tails_first():
    idx = ExpectedBlocks(ttl_s=100.0)
    a, b = prompt_blocks("m", text("a")), prompt_blocks("m", text("b"))
    assert len(a) == 5 and len(b) == 5
    idx.insert("e0", a, 0.0, capacity=8)
    idx.insert("e0", b, 1.0, capacity=8)  # 10 entries > 8: a's two oldest-touched go, its tail
    assert idx.blocks("e0") == 8
    assert idx.depths(a, 2.0) == {"e0": 3} and idx.depths(b, 2.0) == {"e0": 5}
    idx.insert("e1", a, 2.0, capacity=8)  # another engine's entries are its own
    assert idx.depths(a, 3.0) == {"e0": 3, "e1": 5}
    # a bound derived from the engine's KV pool: 64 tokens' KV at 10 bytes per token
    p = PrefixAffinity(PrefixAffinityOptions(block_bytes=64))
    assert p.capacity(eng("e0", cap=640), req("r", "", bpt=10)) == 4  # 64 tokens ~ 256 bytes = 4 chunks
    assert p.capacity(eng("e0"), req("r", "")) == 4096  # unknown capacity: the default
    p.choose("m", [eng("e0", cap=640)], request=req("r1", "x" * 640, bpt=10))
    assert p.index.blocks("e0") == 4


def cached(eid: str, size: int | None, queued: int = 0) -> EngineCandidate:
    return EngineCandidate(eid, ("m",), running=queued, prefix_cached_bytes=size)


def test_reported_cache_sizes_cut_the_index_when_they_change():
    # 64-byte chunks at 10 KV bytes per token: a chunk is 16 tokens' KV, 160 bytes
    p = PrefixAffinity(PrefixAffinityOptions(block_bytes=64))
    a, b = text("a", 80), text("b", 80)  # 4 full chunks each
    assert p.choose("m", [cached("e0", 0), cached("e1", 0)], request=req("r0", a, 0.0, bpt=10)) == "e0"
    # e0 still reports 0 (its prefill has not run): unchanged, so a's entries stay
    assert p.choose("m", [cached("e0", 0, 1), cached("e1", 0)], request=req("r1", a, 1.0, bpt=10)) == "e0"
    assert p.index.blocks("e0") == 4
    p.choose("m", [cached("e0", 640, 9), cached("e1", 0)], request=req("r2", b, 2.0, bpt=10))  # b: e1
    assert p.index.blocks("e0") == 4 and p.index.blocks("e1") == 4  # 640 bytes = 4 chunks: all kept
    # e0 evicted under pressure: 2 chunks left, its LRU end (the tail of a) goes first
    p.choose("m", [cached("e0", 320, 9), cached("e1", 640)], request=req("r3", text("c", 30), 3.0, bpt=10))
    assert p.index.depths(prompt_blocks("m", a, 64), 3.0) == {"e0": 2} and p.stats.trimmed == 2
    # a restart (or the model unloaded): 0 bytes, nothing held; a then goes by load
    assert p.choose("m", [cached("e0", 0), cached("e1", 640, 1)], request=req("r4", a, 4.0, bpt=10)) == "e0"
    assert p.stats.matched_blocks == 4  # r1's four; r4 found nothing on the restarted e0
    # an engine that reports no size (None) keeps what its dispatch history says
    q = PrefixAffinity(PrefixAffinityOptions(block_bytes=64))
    q.choose("m", [cached("e0", None), cached("e1", None)], request=req("r0", a, 0.0, bpt=10))
    assert (
        q.choose("m", [cached("e0", None, 2), cached("e1", None)], request=req("r1", a, 1.0, bpt=10)) == "e0"
    )


def test_reported_sizes_reach_the_candidates_through_the_load_book():
    book = LoadBook()
    book.report("e0", LoadReport(prefix_cached_bytes=4096))
    book.report("e1", LoadReport())
    assert book.candidate("e0", ("m",)).prefix_cached_bytes == 4096
    assert book.candidate("e1", ("m",)).prefix_cached_bytes is None


def test_session_affinity_follows_the_conversation_within_the_bound():
    p = PrefixAffinity(PrefixAffinityOptions(max_load_excess=2))
    assert p.choose("m", [eng("e0"), eng("e1")], request=req("r0", "short", 0.0, session="c1")) == "e0"
    # no shared prefix (prompts under one chunk), yet the conversation goes back to e0
    assert p.choose("m", [eng("e0", 2), eng("e1")], request=req("r1", "other", 1.0, session="c1")) == "e0"
    assert p.stats.session_hits == 1
    # past the bound it moves, and the conversation follows its new engine
    assert p.choose("m", [eng("e0", 3), eng("e1")], request=req("r2", "x", 2.0, session="c1")) == "e1"
    assert p.choose("m", [eng("e0"), eng("e1", 1)], request=req("r3", "y", 3.0, session="c1")) == "e1"
    # a session beats a longer prefix held elsewhere
    p.choose("m", [eng("e0"), eng("e1", 9)], request=req("r4", SYSTEM, 4.0))  # e0 holds SYSTEM
    assert p.choose("m", [eng("e0"), eng("e1")], request=req("r5", SYSTEM, 5.0, session="c1")) == "e1"
    # sessions expire with ttl_s and are LRU-bounded
    q = PrefixAffinity(PrefixAffinityOptions(ttl_s=5.0, max_sessions=1))
    q.choose("m", [eng("e0"), eng("e1", 1)], request=req("r0", "", 0.0, session="a"))
    assert q.choose("m", [eng("e0", 1), eng("e1")], request=req("r1", "", 1.0, session="a")) == "e0"
    assert q.choose("m", [eng("e0", 1), eng("e1")], request=req("r2", "", 7.0, session="a")) == "e1"
    q.choose("m", [eng("e0"), eng("e1", 1)], request=req("r3", "", 8.0, session="b"))
    assert list(q.sessions) == ["b"]


def test_without_a_prompt_it_is_join_the_shortest_queue():
    p = PrefixAffinity()
    cands = [eng("e0", 3), eng("e1", 1), eng("e2", 1)]
    assert p.choose("m", cands) == "e1"
    assert p.choose("m", cands, request=req("r", "")) == "e1"
    assert len(p.index) == 0 and p.stats.requests == 0
    with pytest.raises(NoCandidate):
        p.choose("m", cands, frozenset({"e0", "e1", "e2"}))


def test_declares_what_it_reads_and_validates_its_options():
    needs = dispatch_needs("prefix_affinity")
    assert needs.reads_queue and needs.reads_prompt and not needs.reads_kv
    assert "prompt text" in needs.describe()
    p = make_dispatch_policy("prefix_affinity", block_bytes=64, ttl_s=30, max_load_excess=0)
    assert isinstance(p, PrefixAffinity) and p.options == PrefixAffinityOptions(
        block_bytes=64, ttl_s=30.0, max_load_excess=0
    )
    for bad in (
        {"block_bytes": 0},
        {"block_bytes": 2.5},
        {"block_bytes": 100},
        {"max_blocks": -1},
        {"capacity_blocks": 0},
        {"ttl_s": 0},
        {"ttl_s": float("inf")},
        {"max_load_excess": -1},
        {"max_load_excess": True},
        {"max_load_ratio": 0.5},
        {"max_sessions": 0},
        {"unknown": 1},
    ):
        with pytest.raises(ValueError, match="bad options for dispatch policy 'prefix_affinity'"):
            make_dispatch_policy("prefix_affinity", **bad)
