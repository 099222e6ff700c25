"""Block allocator: copy-on-write forks, KV import reservations, pickling, and the calls planners
(the engine core, the simulator) make."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
from llmfleet.kvblocks import (
    BlockTable,
    DuplicateSequence,
    OutOfBlocks,
    ShapeMismatch,
    Slot,
    UnknownSequence,
)
from pool_helpers import A, B, pool, snapshot


# ------------------------------------------------------------------------------------ fork
def test_fork_shares_full_blocks_and_copies_the_partial_one():
    a = pool()
    a.allocate("p", "a", 19)  # blocks 0, 1 full; 2 holds 3 tokens
    copies = a.fork("p", "c")
    assert copies == [(2, 3)]
    assert a.table("c") == BlockTable("a", (0, 1, 3), 19, 8)
    assert [a.block_refcount(b) for b in range(5)] == [2, 2, 1, 1, 0]
    assert a.used_blocks == 4  # shared blocks once
    u = a.stats().models["a"]
    assert (u.blocks, u.tokens, u.sequences, u.token_capacity) == (4, 19 + 3, 2, 32)
    # Appends go to each sequence's own last block.
    assert a.append_slot("p") == Slot(2, 3)
    assert a.append_slot("c") == Slot(3, 3)
    # Freeing one owner keeps shared blocks alive.
    assert a.free("p") == 1  # only block 2
    assert [a.block_refcount(b) for b in range(4)] == [1, 1, 0, 1]
    assert a.slots("c", 0, 20) == [Slot(0, i) for i in range(8)] + [Slot(1, i) for i in range(8)] + [
        Slot(3, i) for i in range(4)
    ]
    assert a.free("c") == 3
    assert a.free_blocks == 16 and a.stats().models["a"] == a.stats().models["b"]


def test_fork_of_block_aligned_sequence_copies_nothing():
    a = pool()
    a.allocate("p", "b", 20)
    assert a.fork("p", "c") == []
    assert a.table("c").blocks == a.table("p").blocks == (0, 1)
    assert a.used_blocks == 2
    assert a.append_slot("p") == Slot(2, 0)  # the shared last block is full: new block
    assert a.append_slot("c") == Slot(3, 0)
    assert a.fork("c", "g") == [(3, 4)]  # fork of a fork
    assert a.block_refcount(0) == 3
    assert a.free("c") == 1 and a.free("p") == 1 and a.free("g") == 3  # 3; 2; 0, 1, 4
    assert a.free_blocks == 16


def test_fork_errors_change_nothing():
    a = pool(3)
    a.allocate("p", "a", 17)  # 3 blocks, last partial, pool full
    a_empty = pool(3)
    a_empty.allocate("e", "a", 0)
    assert a_empty.fork("e", "f") == [] and a_empty.table("f").blocks == ()
    before = snapshot(a, "p", "c")
    with pytest.raises(OutOfBlocks, match="to fork 'p' into 'c' but only 0 of 3 are free") as e:
        a.fork("p", "c")
    assert (e.value.needed, e.value.free) == (1, 0)
    with pytest.raises(DuplicateSequence):
        a.fork("p", "p")
    assert snapshot(a, "p", "c") == before


# ------------------------------------------------------------------------------------ import
def test_reserve_import():
    src = pool()
    src.allocate("r", "b", 23)
    n = src.num_tokens("r")
    plan = [(s, min(s + 10, n)) for s in range(0, n, 10)]  # the migration's chunks of 10 tokens
    dst = pool(8)
    dst.allocate("other", "a", 1)
    t = dst.reserve_import("r", "b", src.models()["b"], n)
    assert t == BlockTable("b", (1, 2, 3), 23, 10)
    assert [len(dst.slots("r", s, e)) for s, e in plan] == [10, 10, 3]
    assert [len(src.slots("r", s, e)) for s, e in plan] == [10, 10, 3]
    assert [x for s, e in plan for x in dst.slots("r", s, e)] == dst.slots("r", 0, n)


def test_reserve_import_shape_mismatch_and_no_room_allocate_nothing():
    dst = pool(2)
    before = snapshot(dst, "r")
    with pytest.raises(ShapeMismatch) as e:
        dst.reserve_import("r", "b", A, 5)
    assert str(A) in str(e.value) and str(B) in str(e.value) and "'r'" in str(e.value)
    with pytest.raises(OutOfBlocks) as e:
        dst.reserve_import("r", "b", B, 21)
    assert (e.value.needed, e.value.free) == (3, 2) and "21 tokens" in str(e.value)
    assert snapshot(dst, "r") == before
    dst.allocate("r", "a", 1)
    with pytest.raises(DuplicateSequence):
        dst.reserve_import("r", "b", B, 1)


# ------------------------------------------------------------------------------------ misc
def test_pickle_round_trip():
    a = pool()
    a.allocate("p", "a", 19)
    a.fork("p", "c")
    b = pickle.loads(pickle.dumps(a))
    assert snapshot(b, "p", "c") == snapshot(a, "p", "c")
    assert b.append_slot("c") == a.append_slot("c")
    e = pickle.loads(pickle.dumps(OutOfBlocks(3, 1, "msg")))
    assert (e.needed, e.free, str(e)) == (3, 1, "msg")
    assert str(OutOfBlocks(2, 0)) == "need 2 KV blocks but only 0 are free"


def test_importing_the_package_does_not_import_torch():
    code = "import sys, llmfleet.kvblocks; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ------------------------------------------------------------------------------------ planner calls
def test_reserve_is_allocate_without_the_snapshot():
    a, b = pool(), pool()
    assert a.reserve("s", "a", 19) == 3
    assert b.allocate("s", "a", 19) == a.table("s")
    assert snapshot(a, "s", "big") == snapshot(b, "s", "big")
    with pytest.raises(DuplicateSequence):
        a.reserve("s", "a", 1)
    with pytest.raises(OutOfBlocks):
        a.reserve("big", "a", 8 * 14)
    assert snapshot(a, "s", "big") == snapshot(b, "s", "big")


def test_grow_each_is_all_or_nothing_and_matches_appends():
    a, b = pool(), pool()
    for x in (a, b):
        x.allocate("s", "a", 8)  # block-aligned: the next token takes a block
        x.allocate("t", "b", 3)
    assert a.blocks_needed_to_grow_each(["s", "t"], 1) == 1
    assert a.grow_each(["s", "t"], 1) == 1  # one new block, for s
    for sid in ("s", "t"):
        b.append_slot(sid)
    assert snapshot(a, "s", "t") == snapshot(b, "s", "t")
    assert a.blocks_needed_to_grow_each(["s", "t"], 25) == 3 + 2
    assert a.grow_each(["s", "t"], 25) == 5  # several blocks per sequence
    for _ in range(25):
        for sid in ("s", "t"):
            b.append_slot(sid)
    # the same blocks per sequence and the same usage (ids differ: appends interleave the sequences)
    for sid in ("s", "t"):
        ta, tb = a.table(sid), b.table(sid)
        assert (ta.num_tokens, ta.num_blocks) == (tb.num_tokens, tb.num_blocks)
    assert a.stats() == b.stats()
    before = snapshot(a, "s", "t", "nope")
    with pytest.raises(OutOfBlocks):
        a.grow_each(["s", "t"], 8 * 16)
    with pytest.raises(UnknownSequence, match="'nope'"):
        a.grow_each(["s", "nope"], 1)
    with pytest.raises(UnknownSequence, match="'nope'"):
        a.blocks_needed_to_grow_each(["nope"], 1)
    assert snapshot(a, "s", "t", "nope") == before


def test_free_with_and_without_shared_blocks_elsewhere():
    """Freeing takes a fast path while no block is shared; a fork anywhere switches to counting."""
    a = pool()
    a.allocate("x", "a", 17)  # blocks 0, 1, 2
    a.allocate("p", "a", 16)  # blocks 3, 4
    a.fork("p", "c")  # shares 3, 4
    assert a.free("x") == 3  # unshared sequence while others share: all its blocks go back
    assert [a.block_refcount(i) for i in range(5)] == [0, 0, 0, 2, 2]
    assert a.free("p") == 0 and [a.block_refcount(i) for i in (3, 4)] == [1, 1]
    assert a.free("c") == 2
    a.allocate("y", "a", 9)  # nothing shared now: the fast path, LIFO reuse as before
    assert a.table("y").blocks == (3, 4) and a.free("y") == 2
    assert a.free_blocks == 16 and a.stats().models["a"].tokens == 0
