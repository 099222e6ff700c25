"""Shared helpers of the allocator tests: two KV shapes, a test pool, and the pool's observable state
read through its public API only."""

from __future__ import annotations

import copy

from llmfleet.kvblocks import BlockAllocator, KvShape

# Two shapes with different token sizes, so one 4 KiB block holds a different number of tokens of each.
A = KvShape(num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32")  # 2·2·2·16·4 = 512 B/token
B = KvShape(num_layers=3, num_kv_heads=1, head_dim=32, dtype="float16")  # 2·3·1·32·2 = 384 B/token
BB = 4096  # T_A = 8 (no tail), T_B = 10 (tail 4096 − 3840 = 256 B per block)


def pool(num_blocks: int = 16, watermark: float = 0.0, *, models: bool = True) -> BlockAllocator:
    a = BlockAllocator(num_blocks, BB, watermark=watermark)
    if models:
        a.register_model("a", A)
        a.register_model("b", B)
    return a


# Two bytes per token: fits any block, so a probe of it can take every free block of any test pool.
PROBE = KvShape(num_layers=1, num_kv_heads=1, head_dim=1, dtype="float8_e4m3fn")


def free_order(a: BlockAllocator) -> list[int]:
    """The free block ids in the order the pool hands them out, read through the public API only: a
    copy of the pool allocates all of its free blocks to one probe sequence (``a`` is not touched)."""
    if not a.free_blocks:
        return []
    probe = copy.deepcopy(a)
    tpb = probe.register_model("__probe__", PROBE)
    blocks = list(probe.allocate("__probe__", "__probe__", probe.free_blocks * tpb).blocks)
    assert len(blocks) == len(set(blocks)) == a.free_blocks
    return blocks


def snapshot(a: BlockAllocator, *seq_ids: str):
    """Everything observable about the pool; ``seq_ids`` are the ids a test uses (live or not)."""
    return (
        free_order(a),
        len(a),
        {s: a.table(s) if s in a else None for s in seq_ids},
        [a.block_refcount(b) for b in range(a.num_blocks)],
        a.stats(),
    )
