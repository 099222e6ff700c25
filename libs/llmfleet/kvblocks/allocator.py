"""The unified KV pool's block allocator (SeaLLM §5 merged blocks), pure Python: sequences and their
block tables over a :class:`~llmfleet.kvblocks.pool.BlockPool`.

A sequence's block table is a list of block ids and token ``p`` lives at
``Slot(block=blocks[p // T_m], offset=p % T_m)`` (``table.py``).

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

Prefix caching (``prefix.py``): ``cache_blocks`` names a sequence's blocks by their hash chain as
they become full (their K/V written: prompt blocks after their prefill, output blocks as decoding
fills them); ``reserve(..., prefix=hashes)`` starts a sequence on the cached blocks
``match`` found, read-only and reference counted, so only the tokens after them are computed. When the
last holder lets a cached block go it stays cached, idle, in LRU order (see ``pool.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.kvblocks.errors import DuplicateSequence, OutOfBlocks, ShapeMismatch, UnknownSequence
from llmfleet.kvblocks.pool import BlockPool, SeqEntry, non_negative
from llmfleet.kvblocks.shapes import KvShape
from llmfleet.kvblocks.table import BlockTable, Slot

__all__ = ["BlockAllocator"]


class BlockAllocator(BlockPool):
    """Per-sequence block tables of one unified KV pool: sequences start, grow, fork and end here."""

    __slots__ = ()

    def __repr__(self) -> str:
        return (
            f"BlockAllocator(num_blocks={self._num_blocks}, block_bytes={self._block_bytes}, "
            f"free={self.free_blocks}, models={len(self._models)}, sequences={len(self._seqs)})"
        )

    # --------------------------------------------------------------------------- sequences

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
        num_tokens = non_negative("num_tokens", num_tokens)
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
        is_idle = cache.is_idle
        room = self.free_blocks - sum(1 for b in hits if is_idle(b))
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
        self._seqs[seq_id] = SeqEntry(m, hits + self._take(fresh, m), num_tokens, len(hits))
        m.tokens += num_tokens - len(hits) * t
        m.sequences += 1
        return fresh

    def cache_blocks(self, seq_id: str, hashes: Sequence[int], start: int = 0) -> int:
        """Name the blocks ``start, start + 1, ...`` of ``seq_id`` (full, their K/V written) by
        ``hashes`` so later sequences can start on them; blocks or hashes already cached are left as
        they are. Returns how many blocks became cached."""
        seq = self._seq(seq_id)
        start = non_negative("start", start)
        if (start + len(hashes)) * seq.model.tpb > seq.num_tokens:
            raise ValueError(f"{seq_id!r}: only full blocks are cached ({seq.num_tokens} tokens)")
        add, blocks = self._cache.add, seq.blocks
        return sum([add(blocks[i], h) for i, h in enumerate(hashes, start)])

    def own_tokens(self, seq_id: str) -> int:
        """Tokens of ``seq_id`` outside the cached prefix it started on (the KV it added to the pool)."""
        seq = self._seq(seq_id)
        return seq.num_tokens - seq.hits * seq.model.tpb

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
            elif self._cache.idle_count:
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
        n = non_negative("n", n)
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
        non_negative("n", n)
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
        self._seqs[dst_seq_id] = SeqEntry(m, shared, src.num_tokens)
        m.sequences += 1
        return copies

    # ----------------------------------------------------------------------------- queries

    def table(self, seq_id: str) -> BlockTable:
        seq = self._seq(seq_id)
        return BlockTable(seq.model.name, tuple(seq.blocks), seq.num_tokens, seq.model.tpb)

    def num_tokens(self, seq_id: str) -> int:
        return self._seq(seq_id).num_tokens

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    def __len__(self) -> int:
        return len(self._seqs)

    # --------------------------------------------------------------------------- internals

    def _seq(self, seq_id: str) -> SeqEntry:
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
