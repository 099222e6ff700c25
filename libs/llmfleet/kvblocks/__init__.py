"""Unified paged KV pool (SeaLLM merged blocks): shapes, the pure block allocator and its accounting.

Pure Python on purpose (the simulator imports it); the torch storage is ``llmfleet.kvblocks.storage``
and is imported explicitly by the engine.
"""

from llmfleet.kvblocks.allocator import BlockAllocator
from llmfleet.kvblocks.errors import (
    DuplicateSequence,
    KvBlocksError,
    ModelInUse,
    OutOfBlocks,
    ShapeMismatch,
    UnknownModel,
    UnknownSequence,
)
from llmfleet.kvblocks.prefix import block_hash, prefix_block_hashes
from llmfleet.kvblocks.shapes import DTYPE_BYTES, KvShape
from llmfleet.kvblocks.stats import ModelUsage, PoolStats, PrefixCacheStats
from llmfleet.kvblocks.table import BlockTable, Slot

__all__ = [
    "DTYPE_BYTES",
    "BlockAllocator",
    "BlockTable",
    "DuplicateSequence",
    "KvBlocksError",
    "KvShape",
    "ModelInUse",
    "ModelUsage",
    "OutOfBlocks",
    "PoolStats",
    "PrefixCacheStats",
    "ShapeMismatch",
    "Slot",
    "UnknownModel",
    "UnknownSequence",
    "block_hash",
    "prefix_block_hashes",
]
