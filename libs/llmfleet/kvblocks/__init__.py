"""Unified paged KV pool (SeaLLM merged blocks): shapes, the pure block allocator and its accounting.

Pure Python on purpose (the simulator imports it); the torch storage is ``llmfleet.kvblocks.storage``
and is imported explicitly by the engine.
"""

from llmfleet.kvblocks.allocator import (
    BlockAllocator,
    BlockTable,
    DuplicateSequence,
    KvBlocksError,
    ModelInUse,
    OutOfBlocks,
    ShapeMismatch,
    Slot,
    UnknownModel,
    UnknownSequence,
)
from llmfleet.kvblocks.shapes import DTYPE_BYTES, KvShape
from llmfleet.kvblocks.stats import ModelUsage, PoolStats

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
    "ShapeMismatch",
    "Slot",
    "UnknownModel",
    "UnknownSequence",
]
