"""The unified KV pool's block allocator (SeaLLM §5 merged blocks), pure Python.

One pool of ``num_blocks`` physical blocks of ``block_bytes`` each is shared by every registered model.
A block belongs to one model at a time and holds ``T_m = floor(block_bytes / bytes_per_token_m)`` of its
tokens (all layers and KV heads), so a sequence's block table is a list of block ids and token ``p``
lives at ``Slot(block=blocks[p // T_m], offset=p % T_m)``.

This object only plans: it owns block ids, reference counts and block tables, never bytes. The engine's
torch storage (``llmfleet.kvblocks.storage``) moves the bytes; the simulator uses this very object for
KV accounting. No torch, no I/O, no clock.

Conventions:

- ``allocate(seq, model, n)`` records ``n`` tokens as present (prefill) and reserves ``ceil(n / T_m)``
  blocks; ``n == 0`` reserves nothing (the first ``append_slot`` takes a block).
- ``allocate``, ``reserve_import``, ``fork`` and the appends check the hard capacity only. The
  watermark is an *admission* rule applied by ``can_allocate`` (vLLM-style): new sequences are admitted
  only if ``watermark_blocks`` stay free afterwards, so running sequences can keep decoding into them.
- Forking shares full blocks (reference counted) and copies the partial last block; shared blocks are
  full, so appending never writes into a shared block and no copy-on-write happens later.
- Every failing operation leaves the allocator unchanged.

Prefix caching (``prefix.py``): ``cache_blocks`` names a sequence's full prompt blocks by their hash
chain once their K/V is written; ``reserve(..., prefix=hashes)`` starts a sequence on the cached blocks
``match`` found, read-only and reference counted, so only the tokens after them are computed. When the
last holder lets a cached block go it stays cached, idle, in LRU order: idle blocks count as free
(``free_blocks``), and an allocation that finds no never-cached free block takes the least recently
idled one, so caching never makes an allocation fail. A block several sequences hold counts once in
the usage statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from llmfleet.kvblocks.errors import (
    DuplicateSequence,
    KvBlocksError,
    ModelInUse,
    OutOfBlocks,
    ShapeMismatch,
    UnknownModel,
    UnknownSequence,
)
from llmfleet.kvblocks.freelist import FreeBlocks
from llmfleet.kvblocks.prefix import PrefixIndex
from llmfleet.kvblocks.shapes import KvShape
from llmfleet.kvblocks.stats import ModelUsage, PoolStats, PrefixCacheStats

__all__ = [
    "BlockAllocator",
    "BlockTable",
    "DuplicateSequence",
    "KvBlocksError",
    "ModelInUse",
    "OutOfBlocks",
    "ShapeMismatch",
    "Slot",
    "UnknownModel",
    "UnknownSequence",
]


# ------------------------------------------------------------------------------------------ plain data
class Slot(NamedTuple):
    """Where one token's K/V live: physical ``block`` and the token ``offset`` inside it (< T_m)."""

    block: int
    offset: int


@dataclass(frozen=True, slots=True)
class BlockTable:
    """A snapshot of one sequence's blocks: token ``p`` is at ``blocks[p // T], p % T``."""

    model: str
    blocks: tuple[int, ...]
    num_tokens: int
    tokens_per_block: int

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def capacity(self) -> int:
        """Tokens the reserved blocks can hold (appends below this take no new block)."""
        return len(self.blocks) * self.tokens_per_block

    def slot(self, position: int) -> Slot:
        if not 0 <= position < self.num_tokens:
            raise IndexError(f"position {position} outside [0, {self.num_tokens})")
        q, r = divmod(position, self.tokens_per_block)
        return Slot(self.blocks[q], r)


# ------------------------------------------------------------------------------------ internal state
class _Model:
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


class _Seq:
    __slots__ = ("blocks", "hits", "model", "num_tokens")

    def __init__(self, model: _Model, blocks: list[int], num_tokens: int, hits: int = 0) -> None:
        self.model = model
        self.blocks = blocks
        self.num_tokens = num_tokens
        self.hits = hits  # leading blocks taken from the prefix cache


def _count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------ allocator
class BlockAllocator:
    """Block ids, reference counts and per-sequence block tables of one unified KV pool."""

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
        self._wm = int(watermark * num_blocks)
        # pop() hands out the lowest ids first; freed blocks are reused first (LIFO).
        self._free = FreeBlocks(num_blocks)
        # Reference counts, sparse: a block is free, idle in the prefix cache, held by one sequence, or
        # shared by forks and cache hits (its count, ≥ 2, here). With nothing shared, taking and freeing
        # blocks touch no counts.
        self._shared: dict[int, int] = {}
        self._cache = PrefixIndex()
        self._models: dict[str, _Model] = {}
        self._seqs: dict[str, _Seq] = {}

    def __repr__(self) -> str:
        return (
            f"BlockAllocator(num_blocks={self._num_blocks}, block_bytes={self._block_bytes}, "
            f"free={self.free_blocks}, models={len(self._models)}, sequences={len(self._seqs)})"
        )

    # ------------------------------------------------------------------------------------ properties
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
        return len(self._free) + len(self._cache.idle)

    @property
    def used_blocks(self) -> int:
        """Blocks live sequences hold (each once, however many hold it)."""
        return self._num_blocks - self.free_blocks

    # ------------------------------------------------------------------------------------ models
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
        self._models[name] = _Model(name, shape, tpb)
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
        return -(-_count("num_tokens", num_tokens) // self._model(model).tpb)

    # ------------------------------------------------------------------------------------ sequences
    def can_allocate(self, model: str, num_tokens: int, *, ignore_watermark: bool = False) -> bool:
        """Admission check: would ``allocate`` succeed and leave ``watermark_blocks`` free?"""
        needed = self.blocks_needed(model, num_tokens)
        reserve = 0 if ignore_watermark else self._wm
        return self.free_blocks - needed >= reserve

    def allocate(self, seq_id: str, model: str, num_tokens: int) -> BlockTable:
        """Start a sequence holding ``num_tokens`` tokens (e.g. a prompt) and reserve their blocks.

        Reserves ``ceil(num_tokens / T_m)`` blocks (none for 0 tokens). Checks the hard capacity only;
        call ``can_allocate`` first to respect the watermark.
        """
        self.reserve(seq_id, model, num_tokens)
        return self.table(seq_id)

    def reserve(self, seq_id: str, model: str, num_tokens: int, prefix: Sequence[int] = ()) -> int:
        """:meth:`allocate` without building the block-table snapshot (for planners such as the
        simulator); returns the number of new blocks reserved.

        ``prefix``: hashes of cached blocks (:meth:`match`) the sequence starts on, read-only; the
        blocks after them are new. ``OutOfBlocks`` when the new ones do not fit.
        """
        m = self._model(model)
        num_tokens = _count("num_tokens", num_tokens)
        self._check_new(seq_id)
        t = m.tpb
        needed = -(-num_tokens // t)
        cache = self._cache
        try:
            hits = [cache.by_hash[h] for h in prefix]
        except KeyError:
            raise ValueError(f"{seq_id!r}: a prefix block is not cached (call match first)") from None
        if len(hits) * t > num_tokens:
            raise ValueError(f"{seq_id!r}: {len(hits)} cached blocks exceed its {num_tokens} tokens")
        fresh = needed - len(hits)
        idle = cache.idle
        room = self.free_blocks - sum(1 for b in hits if b in idle)
        if fresh > room:
            raise OutOfBlocks(
                fresh,
                room,
                f"need {fresh} KV blocks to allocate {num_tokens} tokens of {m.name!r} ({t}/block) but "
                f"only {room} of {self._num_blocks} are free ({self._block_bytes} bytes each)",
            )
        shared = self._shared
        for b in hits:  # taken before the new blocks, so that making room never evicts them
            if cache.claim(b):
                m.blocks += 1
                m.tokens += t
            else:
                shared[b] = shared.get(b, 1) + 1
        self._seqs[seq_id] = _Seq(m, hits + self._take(fresh, m), num_tokens, len(hits))
        m.tokens += num_tokens - len(hits) * t
        m.sequences += 1
        return fresh

    # ------------------------------------------------------------------------------------ prefix cache
    def match(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes`` (a prompt's block hash chain), from the first, are cached here."""
        return self._cache.match(hashes)

    def cache_blocks(self, seq_id: str, hashes: Sequence[int]) -> int:
        """Name the first ``len(hashes)`` blocks of ``seq_id`` (full, their K/V written) by ``hashes``
        so later sequences can start on them; blocks or hashes already cached are left as they are.
        Returns how many blocks became cached."""
        seq = self._seq(seq_id)
        if len(hashes) * seq.model.tpb > seq.num_tokens:
            raise ValueError(f"{seq_id!r}: only full blocks are cached ({seq.num_tokens} tokens)")
        add, blocks = self._cache.add, seq.blocks
        return sum([add(blocks[i], h) for i, h in enumerate(hashes)])

    def own_tokens(self, seq_id: str) -> int:
        """Tokens of ``seq_id`` outside the cached prefix it started on (the KV it added to the pool)."""
        seq = self._seq(seq_id)
        return seq.num_tokens - seq.hits * seq.model.tpb

    @property
    def cached_blocks(self) -> int:
        """Blocks in the prefix cache (held by sequences or idle)."""
        return len(self._cache)

    def prefix_cache_stats(self) -> PrefixCacheStats:
        cache = self._cache
        return PrefixCacheStats(len(cache), len(cache.idle), tuple(cache.recent))

    def reserve_import(self, seq_id: str, model: str, shape: KvShape, num_tokens: int) -> BlockTable:
        """Reserve blocks for ``num_tokens`` tokens migrating in from another engine.

        The model must be registered with exactly ``shape`` (``ShapeMismatch`` otherwise) and the blocks
        must fit (``OutOfBlocks``); on either error nothing is allocated. The storage then writes the
        incoming K/V at ``slots(seq_id, 0, num_tokens)``.
        """
        m = self._model(model)
        if m.shape != shape:
            raise ShapeMismatch(
                f"cannot import {seq_id!r}: model {model!r} is registered here with {m.shape}, "
                f"the sender's KV has {shape}"
            )
        return self.allocate(seq_id, model, num_tokens)

    def append_slot(self, seq_id: str) -> Slot:
        """The slot where the next token's K/V go; takes a new block when the last one is full.

        O(1), on the per-token hot path. ``OutOfBlocks`` when a block is needed and none is free (the
        engine then preempts); this may use the watermark blocks.
        """
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise self._unknown(seq_id)
        m = seq.model
        n = seq.num_tokens
        offset = n % m.tpb
        if offset == 0:
            free = self._free
            if free:
                block = free.pop()
            elif self._cache.idle:
                block = self._cache.evict()
            else:
                raise OutOfBlocks(
                    1,
                    0,
                    f"need 1 KV block to append to {seq_id!r} ({m.name!r}) but 0 of {self._num_blocks} are free",
                )
            seq.blocks.append(block)
            m.blocks += 1
        else:
            block = seq.blocks[-1]
        seq.num_tokens = n + 1
        m.tokens += 1
        return Slot(block, offset)

    def grow_each(self, seq_ids: list[str], n: int = 1) -> int:
        """``n`` more tokens for every sequence (a batched decode step, or a run of them), all or
        nothing: ``OutOfBlocks`` leaves the allocator unchanged. Returns the number of new blocks."""
        live = self._seqs
        try:
            seqs = [live[i] for i in seq_ids]
        except KeyError:
            raise self._unknown(next(i for i in seq_ids if i not in live)) from None
        n = _count("n", n)
        needs = [-(-(s.num_tokens + n) // s.model.tpb) - len(s.blocks) for s in seqs]
        total = sum(needs)
        free = self._free
        if total > self.free_blocks:
            raise OutOfBlocks(total, self.free_blocks)
        for s, need in zip(seqs, needs, strict=True):
            m = s.model
            if need == 1 and free:  # (the usual case: one block at a block boundary)
                s.blocks.append(free.pop())
                m.blocks += 1
            elif need:
                s.blocks.extend(self._take(need, m))
            s.num_tokens += n
            m.tokens += n
        return total

    def blocks_needed_to_grow_each(self, seq_ids: list[str], n: int) -> int:
        """New blocks :meth:`grow_each` ``(seq_ids, n)`` would take."""
        _count("n", n)
        total = 0
        for i in seq_ids:
            s = self._seq(i)
            total += -(-(s.num_tokens + n) // s.model.tpb) - len(s.blocks)
        return total

    def slots(self, seq_id: str, start: int, end: int) -> list[Slot]:
        """Slots of the existing tokens ``[start, end)`` (``0 <= start <= end <= num_tokens``)."""
        seq = self._seq(seq_id)
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= seq.num_tokens):
            raise IndexError(f"token range [{start}, {end}) outside [0, {seq.num_tokens}] of {seq_id!r}")
        t = seq.model.tpb
        blocks = seq.blocks
        return [Slot(blocks[p // t], p % t) for p in range(start, end)]

    def slot_of(self, seq_id: str, position: int) -> Slot:
        seq = self._seq(seq_id)
        if not (isinstance(position, int) and 0 <= position < seq.num_tokens):
            raise IndexError(f"position {position!r} outside [0, {seq.num_tokens}) of {seq_id!r}")
        q, r = divmod(position, seq.model.tpb)
        return Slot(seq.blocks[q], r)

    def free(self, seq_id: str) -> int:
        """End a sequence; returns how many blocks no sequence holds any more (refcount reached 0):
        they go back to the free list, or stay cached, idle, when they are cached."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise self._unknown(seq_id)
        m = seq.model
        blocks = seq.blocks
        m.sequences -= 1
        shared = self._shared
        cache = self._cache
        if not shared and not cache:  # the common case (nothing shared or cached): every block goes back
            blocks.reverse()  # so that the stack hands them out again in their original order
            self._free.extend(blocks)
            m.blocks -= len(blocks)
            m.tokens -= seq.num_tokens
            return len(blocks)
        t, name = m.tpb, m.name
        last = len(blocks) - 1
        free = self._free
        released = 0
        for i in range(last, -1, -1):  # reversed, as above
            b = blocks[i]
            c = shared.get(b)
            if c is None:
                if not cache.park(b, name):  # (idle cached blocks are evicted oldest first: the tail first)
                    free.append(b)
                released += 1
                m.tokens -= t if i < last else seq.num_tokens - last * t
            elif c == 2:
                del shared[b]
            else:
                shared[b] = c - 1
        m.blocks -= released
        return released

    def fork(self, src_seq_id: str, dst_seq_id: str) -> list[tuple[int, int]]:
        """Copy-on-write fork: ``dst`` shares ``src``'s full blocks and gets a copy of the partial one.

        Returns the ``(src_block, dst_block)`` copies the storage must perform before either sequence
        appends (at most one). Needs one free block when the last block is partial (``OutOfBlocks``).
        """
        src = self._seq(src_seq_id)
        self._check_new(dst_seq_id)
        m = src.model
        t = m.tpb
        full, partial = divmod(src.num_tokens, t)
        self._ensure_free(1 if partial else 0, lambda: f"to fork {src_seq_id!r} into {dst_seq_id!r}")
        shared = src.blocks[:full]
        counts = self._shared
        for b in shared:
            counts[b] = counts.get(b, 1) + 1
        copies: list[tuple[int, int]] = []
        if partial:
            (new,) = self._take(1, m)
            copies.append((src.blocks[full], new))
            shared.append(new)
            m.tokens += partial
        self._seqs[dst_seq_id] = _Seq(m, shared, src.num_tokens)
        m.sequences += 1
        return copies

    # ------------------------------------------------------------------------------------ queries
    def table(self, seq_id: str) -> BlockTable:
        seq = self._seq(seq_id)
        return BlockTable(seq.model.name, tuple(seq.blocks), seq.num_tokens, seq.model.tpb)

    def num_tokens(self, seq_id: str) -> int:
        return self._seq(seq_id).num_tokens

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    def __len__(self) -> int:
        return len(self._seqs)

    def block_refcount(self, block: int) -> int:
        """How many live sequences hold ``block`` (0 = free). A debugging query: O(free blocks)."""
        if not 0 <= block < self._num_blocks:
            raise IndexError(f"block {block} outside [0, {self._num_blocks})")
        count = self._shared.get(block)
        if count is not None:
            return count
        return 0 if block in self._free or block in self._cache.idle else 1

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
            cached_blocks=len(self._cache.idle),
        )

    # ------------------------------------------------------------------------------------ internals
    def _model(self, name: str) -> _Model:
        m = self._models.get(name)
        if m is None:
            raise UnknownModel(f"model {name!r} is not registered (registered: {sorted(self._models)})")
        return m

    def _seq(self, seq_id: str) -> _Seq:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise self._unknown(seq_id)
        return seq

    def _unknown(self, seq_id: str) -> UnknownSequence:
        return UnknownSequence(f"sequence {seq_id!r} is not live in this KV pool")

    def _check_new(self, seq_id: str) -> None:
        if not isinstance(seq_id, str):
            raise TypeError(f"seq_id must be a str, got {type(seq_id).__name__}")
        if seq_id in self._seqs:
            raise DuplicateSequence(f"sequence {seq_id!r} is already live")

    def _ensure_free(self, needed: int, what) -> None:
        free = self.free_blocks
        if needed > free:
            raise OutOfBlocks(
                needed,
                free,
                f"need {needed} KV blocks {what()} but only {free} of {self._num_blocks} are free "
                f"({self._block_bytes} bytes each)",
            )

    def _take(self, n: int, m: _Model) -> list[int]:
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
