"""Prefix caching in the block allocator: the hash chain, hits taken read-only with a reference count,
idle cached blocks in LRU order reclaimed only when an allocation needs them, unregistering a model,
and usage that counts a shared block once."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from llmfleet.kvblocks import BlockAllocator, OutOfBlocks, block_hash, prefix_block_hashes
from llmfleet.kvblocks.freelist import FreeBlocks
from pool_helpers import BB, A, free_order, pool

T = 8  # tokens per block of model "a" (pool_helpers.A)


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_hash_chain_names_model_parent_and_tokens():
    hs = prefix_block_hashes("a", ids(20), T)
    assert len(hs) == 2  # the partial third block has no hash
    assert hs[0] == block_hash("a", None, ids(8)) and hs[1] == block_hash("a", hs[0], ids(8, 8))
    assert prefix_block_hashes("b", ids(20), T) != hs  # two models never share a block
    other = prefix_block_hashes("a", [99, *ids(19, 1)], T)
    assert other[0] != hs[0] and other[1] != hs[1]  # the same second block after another first one
    assert prefix_block_hashes("a", ids(40), T, limit=3) == prefix_block_hashes("a", ids(24), T)
    assert prefix_block_hashes("a", np.arange(20, dtype=np.int32), T) == hs  # as a dispatcher's numpy ids
    assert hs[0] == 0x3C25904E3F453476  # the same in every process and version (not Python's salted hash)


def cached_pool(n_tokens: int = 20) -> tuple[BlockAllocator, list[int]]:
    """A pool where sequence "s" holds ``n_tokens`` of "a" with its full blocks cached."""
    a = pool(16)
    hs = prefix_block_hashes("a", ids(n_tokens), T)
    a.reserve("s", "a", n_tokens)
    assert a.cache_blocks("s", hs) == len(hs)
    return a, hs


def test_a_hit_shares_the_blocks_read_only_and_counts_them_once():
    a, hs = cached_pool()
    assert a.match(hs) == 2 and a.match([hs[0], 12345]) == 1 and a.match([12345, *hs]) == 0
    used = a.used_blocks
    assert a.reserve("t", "a", 21, hs) == 1  # two cached blocks + one new
    t, s = a.table("t"), a.table("s")
    assert t.blocks[:2] == s.blocks[:2] and t.blocks[2] != s.blocks[2]
    assert [a.block_refcount(b) for b in t.blocks] == [2, 2, 1]
    assert a.used_blocks == used + 1
    usage = a.stats().models["a"]
    assert (usage.blocks, usage.tokens) == (4, 20 + 21 - 16)  # shared blocks and tokens count once
    assert a.own_tokens("t") == 5 and a.own_tokens("s") == 20


def test_idle_cached_blocks_stay_cached_and_count_as_free():
    a, hs = cached_pool()
    a.free("s")
    assert a.free_blocks == 16 and a.used_blocks == 0
    stats = a.stats()
    assert stats.cached_blocks == 2 and stats.models["a"].cached_blocks == 2 and stats.models["a"].blocks == 0
    assert a.prefix_cache_stats().blocks == 2 and a.prefix_cache_stats().idle_blocks == 2
    assert a.match(hs) == 2
    a.reserve("t", "a", 17, hs)  # the idle blocks come back into use
    assert a.stats().cached_blocks == 0 and a.stats().models["a"].blocks == 3
    assert a.stats().models["a"].tokens == 17


def test_an_allocation_reclaims_idle_blocks_least_recently_idled_first():
    a = pool(6)
    first = prefix_block_hashes("a", ids(16), T)
    second = prefix_block_hashes("a", ids(16, 100), T)
    for seq, hs in (("x", first), ("y", second)):
        a.reserve(seq, "a", 16)
        a.cache_blocks(seq, hs)
    a.free("x")
    a.free("y")
    assert a.free_blocks == 6 and a.match(first) == 2 and a.match(second) == 2
    a.reserve("big", "a", 3 * T)  # 2 never-cached blocks, then x's tail block (the oldest idle)
    assert a.match(first) == 1 and a.match(second) == 2
    a.reserve("more", "a", 2 * T)  # x's head, then y's tail
    assert a.match(first) == 0 and a.match(second) == 1
    with pytest.raises(OutOfBlocks):
        a.reserve("none", "a", 2 * T)  # one block left: caching never adds room, and never takes it
    assert a.match(second) == 1 and "none" not in a


def test_touching_a_prefix_makes_its_idle_blocks_the_last_evicted_tail_first():
    a = pool(6)
    first = prefix_block_hashes("a", ids(16), T)
    second = prefix_block_hashes("a", ids(16, 100), T)
    for seq, hs in (("x", first), ("y", second)):
        a.reserve(seq, "a", 16)
        a.cache_blocks(seq, hs)
    a.free("x")
    a.free("y")
    assert a.touch([*first, 12345]) == 2  # x's blocks, the oldest idle, become the most recent
    assert a.touch([12345, *second]) == 0  # nothing of a prefix that is not cached
    a.reserve("big", "a", 3 * T)  # 2 never-cached blocks, then y's tail (now the oldest idle)
    assert a.match(first) == 2 and a.match(second) == 1
    a.reserve("more", "a", 2 * T)  # y's head, then x's tail: its head outlives it
    assert a.match(first) == 1 and a.match(second) == 0


def test_a_hit_is_not_evicted_to_make_room_for_its_own_new_blocks():
    a = pool(3)
    hs = prefix_block_hashes("a", ids(16), T)
    a.reserve("x", "a", 16)
    a.cache_blocks("x", hs)
    a.free("x")
    a.reserve("y", "a", 17, hs)  # 2 idle hits + 1 new block: exactly the pool
    assert a.free_blocks == 0 and a.match(hs) == 2
    a.free("y")
    with pytest.raises(OutOfBlocks):
        a.reserve("z", "a", 33, hs)  # 2 hits + 3 new > 3 blocks: nothing taken, nothing evicted
    assert a.match(hs) == 2 and a.free_blocks == 3


def test_appends_and_growth_reclaim_idle_blocks():
    a, hs = cached_pool(16)
    a.free("s")
    a.reserve("t", "a", 14 * T)  # every never-cached block
    assert a.free_blocks == 2
    a.append_slot("t")  # a new block: the idle cached tail
    a.grow_each(["t"], T)  # and the head
    assert a.free_blocks == 0 and a.match(hs) == 0


def test_unregistering_a_model_drops_its_cached_blocks():
    a, hs = cached_pool()
    b_hs = prefix_block_hashes("b", ids(20), 10)
    a.reserve("sb", "b", 20)
    a.cache_blocks("sb", b_hs)
    a.free("s")
    a.free("sb")
    a.unregister_model("a")
    assert a.match(hs) == 0 and a.match(b_hs) == 2
    assert a.free_blocks == 16 and a.stats().cached_blocks == 2
    assert a.register_model("a", A) == T and a.match(hs) == 0


def test_caching_keeps_duplicates_and_unwritten_blocks_out():
    a, hs = cached_pool()
    a.reserve("twin", "a", 20)  # computed the same prefix before it was cached
    assert a.cache_blocks("twin", hs) == 0  # the hashes are taken: its blocks stay uncached
    a.free("twin")
    assert a.stats().cached_blocks == 0
    with pytest.raises(ValueError):
        a.cache_blocks("s", prefix_block_hashes("a", ids(24), T))  # only full blocks are cached
    with pytest.raises(ValueError):
        a.reserve("u", "a", 20, [12345])  # a hash that is not cached
    assert "u" not in a


def test_forks_of_a_sequence_on_cached_blocks_free_cleanly():
    a, hs = cached_pool()
    a.reserve("t", "a", 20, hs)
    a.fork("t", "f")
    for seq in ("s", "t", "f"):
        a.free(seq)
    assert a.free_blocks == 16 and a.used_blocks == 0 and a.stats().cached_blocks == 2
    assert sorted(free_order(a)) == list(range(16))


def test_free_list_hands_out_lowest_ids_and_reuses_freed_ones_first():
    f = FreeBlocks(5)
    assert [f.pop(), f.pop()] == [0, 1] and len(f) == 3
    f.append(0)
    assert f.take(3) == [0, 2, 3] and 4 in f and 1 not in f
    f.extend([2, 1])
    assert [f.pop(), f.pop(), f.pop()] == [1, 2, 4] and len(f) == 0
    with pytest.raises(IndexError):
        f.pop()


def test_a_large_idle_pool_costs_no_memory_per_block():
    tracemalloc.start()
    try:
        big = BlockAllocator(10_000_000, BB)
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert big.free_blocks == 10_000_000 and size < 64 * 1024  # (a list of ids: about 360 MB)
