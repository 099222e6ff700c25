"""The unified KV pool's blocks and models (SeaLLM §5 merged blocks), pure Python: the state the
:class:`~llmfleet.kvblocks.allocator.BlockAllocator` plans with, and the pool-wide queries.

One pool of ``num_blocks`` physical blocks of ``block_bytes`` each is shared by every registered model.
A block belongs to one model at a time and holds ``T_m = floor(block_bytes / bytes_per_token_m)`` of its
tokens (all layers and KV heads). A block is free, idle in the prefix cache (``prefix.py``: named by its
hash, no sequence holds it), held by one sequence, or shared (its reference count, ≥ 2, kept sparsely).
Idle cached blocks count as free (``free_blocks``); taking blocks uses the never-cached free ones first,
then the least recently idled cached ones, so caching never makes an allocation fail. A block several
sequences hold counts once in the usage statistics. No torch, no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmfleet.kvblocks.errors import ModelInUse, OutOfBlocks, ShapeMismatch, UnknownModel
from llmfleet.kvblocks.freelist import FreeBlocks
from llmfleet.kvblocks.prefix import PrefixIndex
from llmfleet.kvblocks.shapes import KvShape
from llmfleet.kvblocks.stats import ModelUsage, PoolStats, PrefixCacheStats

__all__ = ["BlockPool"]


class ModelEntry:
    """A registered model and its live usage counters (maintained incrementally)."""

    __slots__ = ("blocks", "bytes_per_token", "name", "sequences", "shape", "tokens", "tpb")

    def __init__(self, name: str, shape: KvShape, tpb: int) -> None:
        self.name = name
        self.shape = shape
        self.tpb = tpb
        self.bytes_per_token = shape.bytes_per_token
        self.blocks = 0  # distinct physical blocks
        self.tokens = 0  # tokens physically stored in them (shared ones once)
        self.sequences = 0


class SeqEntry:
    """A live sequence: its model, its blocks in token order and its tokens."""

    __slots__ = ("blocks", "hits", "model", "num_tokens")

    def __init__(self, model: ModelEntry, blocks: list[int], num_tokens: int, hits: int = 0) -> None:
        self.model = model
        self.blocks = blocks
        self.num_tokens = num_tokens
        self.hits = hits  # leading blocks taken from the prefix cache


def watermark_blocks(num_blocks: int, watermark: float) -> int:
    """Blocks a pool of ``num_blocks`` keeps free when it admits a new sequence."""
    return int(watermark * num_blocks)


def non_negative(name: str, value: object) -> int:
    """``value``, checked to be a non-negative int (ValueError naming ``name`` otherwise)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


class BlockPool:
    """The blocks, reference counts, prefix cache and models of one unified KV pool, and its queries;
    the sequences' operations are :class:`~llmfleet.kvblocks.allocator.BlockAllocator`'s."""

    __slots__ = (
        "_block_bytes",
        "_cache",
        "_free",
        "_models",
        "_num_blocks",
        "_seqs",
        "_shared",
        "_watermark",
        "_wm",
    )

    def __init__(self, num_blocks: int, block_bytes: int, watermark: float = 0.01) -> None:
        for name, v in (("num_blocks", num_blocks), ("block_bytes", block_bytes)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(watermark, int | float) or not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark!r}")
        self._num_blocks = num_blocks
        self._block_bytes = block_bytes
        self._watermark = float(watermark)
        self._wm = watermark_blocks(num_blocks, watermark)
        # pop() hands out the lowest ids first; freed blocks are reused first (LIFO).
        self._free = FreeBlocks(num_blocks)
        # Reference counts, sparse: a block is free, idle in the prefix cache, held by one sequence, or
        # shared by forks and cache hits (its count, ≥ 2, here). With nothing shared, taking and freeing
        # blocks touch no counts.
        self._shared: dict[int, int] = {}
        self._cache = PrefixIndex(num_blocks)
        self._models: dict[str, ModelEntry] = {}
        self._seqs: dict[str, SeqEntry] = {}

    # -------------------------------------------------------------------------- properties

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_bytes(self) -> int:
        return self._block_bytes

    @property
    def watermark(self) -> float:
        return self._watermark

    @property
    def watermark_blocks(self) -> int:
        """Blocks admission keeps free: ``int(watermark · num_blocks)``."""
        return self._wm

    @property
    def free_blocks(self) -> int:
        """Blocks an allocation may take: the free ones and the idle cached ones."""
        return len(self._free) + self._cache.idle_count

    @property
    def used_blocks(self) -> int:
        """Blocks live sequences hold (each once, however many hold it)."""
        return self._num_blocks - self.free_blocks

    # ------------------------------------------------------------------------------ models

    def register_model(self, name: str, shape: KvShape) -> int:
        """Add a model to the pool and return its T_m; re-registering the same shape is a no-op."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"model name must be a non-empty str, got {name!r}")
        if not isinstance(shape, KvShape):
            raise TypeError(f"shape must be a KvShape, got {type(shape).__name__}")
        m = self._models.get(name)
        if m is not None:
            if m.shape != shape:
                raise ShapeMismatch(f"model {name!r} is registered with {m.shape}, not {shape}")
            return m.tpb
        tpb = shape.tokens_per_block(self._block_bytes)  # ValueError if a block can't hold one token
        self._models[name] = ModelEntry(name, shape, tpb)
        return tpb

    def unregister_model(self, name: str) -> None:
        m = self._model(name)
        if m.sequences:
            raise ModelInUse(f"model {name!r} still has {m.sequences} live sequences ({m.blocks} blocks)")
        self._free.extend(self._cache.drop_model(name))
        del self._models[name]

    def models(self) -> dict[str, KvShape]:
        return {name: m.shape for name, m in self._models.items()}

    def tokens_per_block(self, model: str) -> int:
        return self._model(model).tpb

    def blocks_needed(self, model: str, num_tokens: int) -> int:
        """Blocks a new sequence of ``num_tokens`` tokens of ``model`` takes."""
        return -(-non_negative("num_tokens", num_tokens) // self._model(model).tpb)

    # ------------------------------------------------------------------------ prefix cache

    def match(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes`` (a prompt's block hash chain), from the first, are cached here."""
        return self._cache.match(hashes)

    def touch(self, hashes: Sequence[int]) -> int:
        """A waiting request will start on the cached prefix ``hashes`` names: its idle blocks move to
        the recent end of the LRU (:meth:`~llmfleet.kvblocks.prefix.PrefixIndex.touch`); returns how many did."""
        return self._cache.touch(hashes)

    @property
    def cached_blocks(self) -> int:
        """Blocks in the prefix cache (held by sequences or idle)."""
        return len(self._cache)

    def prefix_cache_stats(self) -> PrefixCacheStats:
        cache = self._cache
        return PrefixCacheStats(len(cache), cache.idle_count)

    # ----------------------------------------------------------------------------- queries

    def block_refcount(self, block: int) -> int:
        """How many live sequences hold ``block`` (0 = free). A debugging query: O(free blocks)."""
        if not 0 <= block < self._num_blocks:
            raise IndexError(f"block {block} outside [0, {self._num_blocks})")
        count = self._shared.get(block)
        if count is not None:
            return count
        return 0 if block in self._free or self._cache.is_idle(block) else 1

    def stats(self) -> PoolStats:
        bb = self._block_bytes
        models: dict[str, ModelUsage] = {}
        frag = 0
        for name, m in self._models.items():
            idle = self._cache.idle_by_model.get(name, 0)
            models[name] = ModelUsage(m.blocks, m.tokens, m.sequences, m.blocks * m.tpb, idle)
            frag += m.blocks * bb - m.tokens * m.bytes_per_token
        used = self.used_blocks
        return PoolStats(
            total_blocks=self._num_blocks,
            free_blocks=self.free_blocks,
            used_blocks=used,
            block_bytes=bb,
            watermark_blocks=self._wm,
            num_sequences=len(self._seqs),
            models=models,
            internal_fragmentation_bytes=frag,
            fragmentation=frag / (used * bb) if used else 0.0,
            utilization=used / self._num_blocks,
            cached_blocks=self._cache.idle_count,
        )

    # --------------------------------------------------------------------------- internals

    def _model(self, name: str) -> ModelEntry:
        m = self._models.get(name)
        if m is None:
            raise UnknownModel(f"model {name!r} is not registered (registered: {sorted(self._models)})")
        return m

    def _ensure_free(self, needed: int, what: Callable[[], str]) -> None:
        free = self.free_blocks
        if needed > free:
            raise OutOfBlocks(
                needed,
                free,
                f"need {needed} KV blocks {what()} but only {free} of {self._num_blocks} are free "
                f"({self._block_bytes} bytes each)",
            )

    def _take(self, n: int, m: ModelEntry) -> list[int]:
        """Pop ``n`` free blocks (the caller checked they exist) for model ``m``."""
        if n <= 0:
            return []
        free = self._free
        short = n - len(free)
        taken = free.take(n - max(0, short))
        if short > 0:  # the rest: idle cached blocks, least recently idled first
            evict = self._cache.evict
            taken += [evict() for _ in range(short)]
        m.blocks += n
        return taken
