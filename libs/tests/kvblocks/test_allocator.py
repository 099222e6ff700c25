"""Unit tests of the unified KV pool's block allocator (SeaLLM merged blocks)."""

from __future__ import annotations

import pytest
from llmfleet.kvblocks import (
    BlockAllocator,
    BlockTable,
    DuplicateSequence,
    KvBlocksError,
    KvShape,
    ModelInUse,
    OutOfBlocks,
    ShapeMismatch,
    Slot,
    UnknownModel,
    UnknownSequence,
)
from pool_helpers import BB, A, B, free_order, pool, snapshot


# ------------------------------------------------------------------------------------ construction
@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, BB), "num_blocks"),
        ((-3, BB), "num_blocks"),
        ((8, 0), "block_bytes"),
        ((8, -1), "block_bytes"),
        ((8.0, BB), "num_blocks"),
        ((8, BB, -0.1), "watermark"),
        ((8, BB, 1.0), "watermark"),
        ((8, BB, 1.5), "watermark"),
    ],
)
def test_constructor_rejects_bad_sizes(args, match):
    with pytest.raises(ValueError, match=match):
        BlockAllocator(*args)


def test_fresh_pool():
    a = BlockAllocator(100, BB)
    assert (a.num_blocks, a.block_bytes, a.free_blocks, a.used_blocks) == (100, BB, 100, 0)
    assert a.watermark == 0.01 and a.watermark_blocks == 1
    assert a.models() == {} and len(a) == 0 and "s" not in a
    assert free_order(a) == list(range(100))  # lowest ids first
    s = a.stats()
    assert (s.total_blocks, s.free_blocks, s.used_blocks, s.fragmentation, s.utilization) == (
        100,
        100,
        0,
        0,
        0,
    )


# ------------------------------------------------------------------------------------ models
def test_register_returns_tokens_per_block_and_is_idempotent():
    a = pool(models=False)
    assert a.register_model("a", A) == 8
    assert a.register_model("b", B) == 10
    assert a.register_model("a", A) == 8  # same shape again: no-op
    assert a.models() == {"a": A, "b": B}
    assert a.tokens_per_block("a") == 8 and a.tokens_per_block("b") == 10


def test_register_other_shape_under_same_name_is_rejected():
    a = pool()
    with pytest.raises(ShapeMismatch, match="registered with") as e:
        a.register_model("a", B)
    assert isinstance(e.value, ValueError)
    assert str(A) in str(e.value) and str(B) in str(e.value)
    assert a.models()["a"] == A


def test_register_rejects_block_too_small_and_bad_names():
    a = BlockAllocator(4, 256)
    with pytest.raises(ValueError, match="cannot hold one token"):
        a.register_model("a", A)  # 512 B/token > 256 B/block
    assert a.models() == {}
    with pytest.raises(ValueError, match="non-empty"):
        a.register_model("", A)
    with pytest.raises(TypeError):
        a.register_model("x", (2, 2, 16))


def test_unregister():
    a = pool()
    a.allocate("s", "a", 3)
    with pytest.raises(ModelInUse, match=r"'a' still has 1 live sequences \(1 blocks\)"):
        a.unregister_model("a")
    a.unregister_model("b")
    assert list(a.models()) == ["a"]
    a.free("s")
    a.unregister_model("a")
    assert a.models() == {}
    with pytest.raises(UnknownModel, match="'a' is not registered"):
        a.unregister_model("a")
    assert a.register_model("a", B) == 10  # the name is free again, any shape


def test_unknown_model_errors_are_key_errors_with_a_readable_message():
    a = pool()
    for call in (
        lambda: a.allocate("s", "zz", 1),
        lambda: a.can_allocate("zz", 1),
        lambda: a.tokens_per_block("zz"),
        lambda: a.reserve_import("s", "zz", A, 1),
        lambda: a.blocks_needed("zz", 1),
        lambda: a.unregister_model("zz"),
    ):
        with pytest.raises(UnknownModel) as e:
            call()
        assert isinstance(e.value, KeyError) and isinstance(e.value, KvBlocksError)
        assert str(e.value) == "model 'zz' is not registered (registered: ['a', 'b'])"
    assert len(a) == 0 and "s" not in a and a.free_blocks == 16


# ------------------------------------------------------------------------------------ allocate
def test_allocate_reserves_ceil_blocks_lowest_ids_first():
    a = pool()
    t = a.allocate("s1", "a", 17)  # ceil(17 / 8) = 3
    assert t == BlockTable("a", (0, 1, 2), 17, 8)
    assert (t.num_blocks, t.capacity) == (3, 24)
    assert a.table("s1") == t and a.num_tokens("s1") == 17 and a.table("s1").model == "a"
    assert a.free_blocks == 13 and a.used_blocks == 3
    assert a.allocate("s2", "b", 10).blocks == (3,)  # exactly one full block of b
    assert a.allocate("s3", "a", 8).blocks == (4,)
    assert [s for s in ("s1", "s2", "s3") if a.table(s).model == "a"] == ["s1", "s3"]
    assert a.table("s2").model == "b"
    assert a.stats().models["a"].sequences == 2 and a.stats().models["b"].sequences == 1
    assert "s1" in a and "nope" not in a and len(a) == 3


def test_allocate_zero_tokens_takes_no_block():
    a = pool()
    t = a.allocate("s", "a", 0)
    assert t.blocks == () and t.num_tokens == 0 and a.free_blocks == 16
    assert a.append_slot("s") == Slot(0, 0)  # the first append takes the block
    assert a.table("s").blocks == (0,)


def test_allocate_errors():
    a = pool(4)
    a.allocate("s", "a", 1)
    before = snapshot(a, "s", "t")
    with pytest.raises(DuplicateSequence, match="'s' is already live"):
        a.allocate("s", "a", 1)
    with pytest.raises(ValueError, match="num_tokens must be a non-negative int"):
        a.allocate("t", "a", -1)
    with pytest.raises(ValueError, match="non-negative int"):
        a.allocate("t", "a", 2.5)
    with pytest.raises(TypeError, match="seq_id must be a str"):
        a.allocate(7, "a", 1)
    with pytest.raises(OutOfBlocks) as e:
        a.allocate("t", "b", 31)  # 4 blocks of b, 3 free
    assert (e.value.needed, e.value.free) == (4, 3)
    assert str(e.value) == (
        "need 4 KV blocks to allocate 31 tokens of 'b' (10/block) but only 3 of 4 are free (4096 bytes each)"
    )
    assert snapshot(a, "s", "t") == before  # failures change nothing
    assert a.allocate("t", "b", 30).blocks == (1, 2, 3)  # exactly the free blocks fit


def test_blocks_needed_and_longest_admissible_sequence():
    a = pool(100, watermark=0.05)
    assert a.blocks_needed("a", 0) == 0
    assert a.blocks_needed("a", 8) == 1 and a.blocks_needed("a", 9) == 2
    assert a.blocks_needed("b", 101) == 11
    # On an empty pool, can_allocate admits up to (num_blocks - watermark_blocks) · T_m tokens.
    assert a.can_allocate("a", 95 * 8) and not a.can_allocate("a", 95 * 8 + 1)
    assert a.can_allocate("b", 95 * 10) and not a.can_allocate("b", 95 * 10 + 1)
    assert a.can_allocate("b", 100 * 10, ignore_watermark=True)
    assert not a.can_allocate("b", 100 * 10 + 1, ignore_watermark=True)


# ------------------------------------------------------------------------------------ two models
def test_two_models_share_one_pool_with_different_tokens_per_block():
    a = pool(8)
    ta = a.allocate("x", "a", 20)  # 3 blocks of 8 → 4 tokens unused in the last one
    tb = a.allocate("y", "b", 20)  # 2 blocks of 10 → full, but 256 B tail per block
    assert ta.tokens_per_block == 8 and tb.tokens_per_block == 10
    assert set(ta.blocks).isdisjoint(tb.blocks) and a.free_blocks == 3
    assert a.slot_of("x", 19) == Slot(ta.blocks[2], 3)
    assert a.slot_of("y", 19) == Slot(tb.blocks[1], 9)
    s = a.stats()
    assert s.models["a"].blocks == 3 and s.models["a"].tokens == 20 and s.models["a"].token_capacity == 24
    assert s.models["b"].blocks == 2 and s.models["b"].tokens == 20 and s.models["b"].token_capacity == 20
    assert s.models["a"].sequences == s.models["b"].sequences == 1
    frag_a = 3 * BB - 20 * 512  # = 4 · 512 = 2048
    frag_b = 2 * BB - 20 * 384  # = 2 · 256 = 512 (only the per-block tail)
    assert s.internal_fragmentation_bytes == frag_a + frag_b == 2560
    assert s.fragmentation == pytest.approx(2560 / (5 * BB))
    assert s.utilization == pytest.approx(5 / 8)
    assert (s.used_blocks, s.free_blocks, s.num_sequences) == (5, 3, 2)
    # Freed blocks of one model are reused by the other.
    a.free("x")
    assert a.allocate("z", "b", 30).blocks == ta.blocks


def test_same_bytes_per_token_gives_same_tokens_per_block():
    # Different shapes, same token size: the dtype counts as much as the geometry.
    a = pool(models=False)
    assert a.register_model("fp32", KvShape(2, 2, 16, "float32")) == a.register_model(
        "fp16", KvShape(4, 1, 32, "float16")
    )


# ------------------------------------------------------------------------------------ watermark
def test_watermark_admission_and_appends_dip_into_it():
    a = pool(100, watermark=0.05)
    assert a.watermark_blocks == 5
    assert a.can_allocate("a", 95 * 8)  # leaves exactly 5 free
    assert not a.can_allocate("a", 95 * 8 + 1)  # would leave 4
    assert a.can_allocate("a", 95 * 8 + 1, ignore_watermark=True)
    assert a.can_allocate("a", 100 * 8, ignore_watermark=True)
    assert not a.can_allocate("a", 100 * 8 + 1, ignore_watermark=True)
    a.allocate("s", "a", 95 * 8)
    assert a.free_blocks == 5
    assert not a.can_allocate("b", 1)
    assert a.can_allocate("b", 0)  # nothing needed, the watermark is intact
    # Running sequences may use the watermark blocks.
    for _ in range(5 * 8):
        a.append_slot("s")
    assert a.free_blocks == 0
    assert not a.can_allocate("b", 0)
    assert not a.can_allocate("b", 1, ignore_watermark=True)


def test_allocate_itself_only_checks_hard_capacity():
    a = pool(10, watermark=0.5)
    assert not a.can_allocate("a", 8 * 6)
    assert a.allocate("s", "a", 8 * 10).num_blocks == 10  # the engine's admission uses can_allocate


def test_watermark_zero_and_rounding():
    assert BlockAllocator(10, BB, watermark=0.0).watermark_blocks == 0
    assert BlockAllocator(10, BB, watermark=0.15).watermark_blocks == 1  # int(1.5)
    assert BlockAllocator(99, BB).watermark_blocks == 0  # int(0.99)


# ------------------------------------------------------------------------------------ append
def test_append_slot_fills_blocks_then_grows():
    a = pool(4)
    a.allocate("s", "a", 6)
    assert [a.append_slot("s") for _ in range(3)] == [Slot(0, 6), Slot(0, 7), Slot(1, 0)]
    assert a.table("s") == BlockTable("a", (0, 1), 9, 8)
    u = a.stats().models["a"]
    assert (u.blocks, u.tokens, u.token_capacity, a.used_blocks) == (2, 9, 16, 2)
    assert a.blocks_needed_to_grow_each(["s"], 1) == 0
    assert a.blocks_needed_to_grow_each(["s"], 7) == 0
    assert a.blocks_needed_to_grow_each(["s"], 8) == 1
    assert a.blocks_needed_to_grow_each(["s"], 0) == 0
    assert a.blocks_needed_to_grow_each([], 5) == 0


def test_append_slot_out_of_blocks_changes_nothing():
    a = pool(2)
    a.allocate("s", "b", 20)
    before = snapshot(a, "s")
    with pytest.raises(OutOfBlocks, match=r"need 1 KV block to append to 's' \('b'\) but 0 of 2") as e:
        a.append_slot("s")
    assert (e.value.needed, e.value.free) == (1, 0)
    assert snapshot(a, "s") == before
    a.free("s")
    a.allocate("t", "b", 19)
    assert a.append_slot("t") == Slot(1, 9)  # room left in the last block: no new block needed


def test_growing_one_sequence_by_a_chunk_is_atomic():
    """A prefill chunk: ``grow_each([seq], n)`` then the new tokens' ``slots``."""
    a = pool(4)
    a.allocate("s", "a", 5)
    before = snapshot(a, "s")
    assert a.grow_each(["s"], 0) == 0 and a.slots("s", 5, 5) == []
    assert snapshot(a, "s") == before
    assert a.grow_each(["s"], 12) == 2  # tokens 5..16 → blocks 0,1,2
    got = a.slots("s", 5, 17)
    assert got == [Slot(0, p) for p in range(5, 8)] + [Slot(1, p) for p in range(8)] + [Slot(2, 0)]
    assert a.table("s") == BlockTable("a", (0, 1, 2), 17, 8) and a.free_blocks == 1
    before = snapshot(a, "s")
    assert a.blocks_needed_to_grow_each(["s"], 7 + 8 + 1) == 2
    with pytest.raises(OutOfBlocks) as e:
        a.grow_each(["s"], 7 + 8 + 1)  # needs 2 blocks, 1 free
    assert (e.value.needed, e.value.free) == (2, 1)
    assert str(e.value) == "need 2 KV blocks but only 1 are free"
    assert snapshot(a, "s") == before
    assert a.grow_each(["s"], 15) == 1 and a.free_blocks == 0
    assert len(a.slots("s", 17, 32)) == 15 and a.num_tokens("s") == 32
    with pytest.raises(ValueError, match="non-negative"):
        a.grow_each(["s"], -1)
    with pytest.raises(ValueError, match="non-negative"):
        a.blocks_needed_to_grow_each(["s"], -1)


def test_unknown_sequence_is_a_key_error_with_message():
    a = pool()
    calls = [
        a.append_slot,
        lambda s: a.grow_each([s], 1),
        lambda s: a.blocks_needed_to_grow_each([s], 1),
        a.free,
        a.table,
        a.num_tokens,
        lambda s: a.slot_of(s, 0),
        lambda s: a.slots(s, 0, 0),
        lambda s: a.fork(s, "x"),
    ]
    for call in calls:
        with pytest.raises(KeyError) as e:
            call("ghost")
        assert isinstance(e.value, UnknownSequence)
        assert str(e.value) == "sequence 'ghost' is not live in this KV pool"


# ------------------------------------------------------------------------------------ slots
def test_slots_and_slot_of():
    a = pool()
    a.allocate("s", "b", 25)  # T = 10 → blocks 0, 1, 2
    assert a.slots("s", 0, 25) == [Slot(p // 10, p % 10) for p in range(25)]
    assert a.slots("s", 9, 11) == [Slot(0, 9), Slot(1, 0)]
    assert a.slots("s", 25, 25) == []
    assert a.slot_of("s", 24) == Slot(2, 4) == a.table("s").slot(24)
    for bad in ((-1, 3), (3, 2), (0, 26)):
        with pytest.raises(IndexError, match=r"outside \[0, 25\]"):
            a.slots("s", *bad)
    for bad in (-1, 25):
        with pytest.raises(IndexError, match=r"outside \[0, 25\)"):
            a.slot_of("s", bad)
    with pytest.raises(IndexError):
        a.table("s").slot(25)


# ------------------------------------------------------------------------------------ free
def test_free_returns_blocks_and_they_are_reused_in_order():
    a = pool()
    a.allocate("s", "a", 20)
    a.allocate("t", "a", 1)
    assert a.free("s") == 3
    assert a.free_blocks == 15
    assert a.allocate("u", "b", 30).blocks == (0, 1, 2)
    with pytest.raises(UnknownSequence, match="'s' is not live"):
        a.free("s")  # double free
    assert a.free("t") == 1 and a.free("u") == 3
    assert a.free_blocks == 16 and a.stats().internal_fragmentation_bytes == 0
