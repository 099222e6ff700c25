"""Prefix caching in the unified KV pool: block hashes and the index of cached blocks.

A full block of a model's prompt is named by a hash chain: ``block_hash(model, parent, token_ids)``
over the model, the previous block's hash (None for the first block) and the block's ``T_m`` token
ids, so equal hashes mean equal prefixes of the same model and two models never share a block. The
functions are pure and stable across processes (blake2b, not Python's salted ``hash``), so a
dispatcher computes the same hashes from a prompt's token ids as the engine does
(:func:`prefix_block_hashes`, with the engine's ``tokens_per_block`` of the model).

:class:`PrefixIndex` is the allocator's part that remembers which blocks hold which hash: blocks that
live sequences hold, and idle blocks no sequence holds, kept in LRU order and given up only when an
allocation needs the room. It holds no references to sequences; the allocator keeps the counts.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from hashlib import blake2b

_UNCACHED, _HELD, _IDLE = 0, 1, 2  # a block's state in the index

__all__ = ["PrefixIndex", "block_hash", "prefix_block_hashes"]


def _token_bytes(token_ids: Iterable[int]) -> bytes:
    """Token ids as little-endian int64 bytes (a numpy array's are converted in one call)."""
    astype = getattr(token_ids, "astype", None)
    if astype is not None:
        return astype("<i8", copy=False).tobytes()
    data = array("q", token_ids)
    if sys.byteorder == "big":
        data.byteswap()
    return data.tobytes()


def _model_key(model: str) -> bytes:
    return model.encode() + b"\x00"


def _chain(key: bytes, parent: int | None, tokens: bytes | memoryview) -> int:
    h = blake2b(key, digest_size=8)
    h.update(b"\x00" * 8 if parent is None else (parent | 1 << 64).to_bytes(9, "little"))
    h.update(tokens)
    return int.from_bytes(h.digest(), "little")


def block_hash(model: str, parent: int | None, token_ids: Sequence[int]) -> int:
    """The 64-bit hash of a block of ``model`` holding ``token_ids`` after the block ``parent``
    (None: the first block of a prompt)."""
    return _chain(_model_key(model), parent, _token_bytes(token_ids))


def prefix_block_hashes(
    model: str,
    token_ids: Iterable[int],
    tokens_per_block: int,
    limit: int | None = None,
    parent: int | None = None,
) -> list[int]:
    """The hashes of the full blocks of ``token_ids`` (blocks of ``tokens_per_block``), first block
    first; at most ``limit`` of them. A trailing partial block has none. ``parent``: the hash of the
    block before ``token_ids`` (the chain continues from it; None: they start the sequence)."""
    if tokens_per_block < 1:
        raise ValueError(f"tokens_per_block must be >= 1, got {tokens_per_block}")
    data = _token_bytes(token_ids)
    step = 8 * tokens_per_block
    n = len(data) // step
    if limit is not None:
        n = min(n, limit)
    key = _model_key(model)
    view = memoryview(data)
    out: list[int] = []
    for i in range(n):
        parent = _chain(key, parent, view[i * step : (i + 1) * step])
        out.append(parent)
    return out


class PrefixIndex:
    """Which block holds which hash; idle cached blocks in LRU order (oldest first).

    Compact, so that a pool full of idle cached blocks costs little: one dict (hash -> block) and, per
    block id, a few fixed-width array entries (``array.array``, grown to the highest block id cached,
    at most ``num_blocks``): its hash, its state (not cached, cached and held, cached and idle), its
    model while idle (an index into the model names) and its links in the intrusive LRU list of idle
    blocks. A block's model is needed only while it is idle: a held block's model is its holders'.
    """

    __slots__ = (
        "_hash",
        "_head",
        "_limit",
        "_model",
        "_model_ids",
        "_models",
        "_next",
        "_prev",
        "_state",
        "_tail",
        "by_hash",
        "idle_by_model",
        "idle_count",
    )

    def __init__(self, num_blocks: int) -> None:
        self.by_hash: dict[int, int] = {}  # hash -> block
        self._limit = num_blocks
        self._hash = array("Q")  # block -> its hash (while cached)
        self._state = array("b")  # block -> _UNCACHED, _HELD or _IDLE
        self._model = array("h")  # block -> its model's index in _models (while idle)
        self._prev = array("i")  # block -> the idle block idled before it (-1: none)
        self._next = array("i")  # block -> the idle block idled after it (-1: none)
        self._head = self._tail = -1  # the least and the most recently idled block
        self._models: list[str] = []
        self._model_ids: dict[str, int] = {}
        self.idle_count = 0
        self.idle_by_model: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.by_hash)

    def is_idle(self, block: int) -> bool:
        """Whether ``block`` is cached and no sequence holds it."""
        state = self._state
        return block < len(state) and state[block] == _IDLE

    def match(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``, from the first, name cached blocks."""
        by_hash = self.by_hash
        n = 0
        for h in hashes:
            if h not in by_hash:
                break
            n += 1
        return n

    def touch(self, hashes: Sequence[int]) -> int:
        """The idle cached blocks of the prefix ``hashes`` names (as far as :meth:`match` finds it) become
        the most recently idled, its first block last, so that its tail is evicted before its head;
        returns how many of them were idle."""
        by_hash, state = self.by_hash, self._state
        moved = 0
        for h in reversed(hashes[: self.match(hashes)]):
            block = by_hash[h]
            if state[block] == _IDLE:
                self._unlink(block)
                self._append(block)
                moved += 1
        return moved

    def add(self, block: int, h: int) -> bool:
        """Name the held ``block`` by ``h``; False when the block or the hash is already cached."""
        state = self._state
        if block >= len(state):
            self._grow(block)
        elif state[block]:
            return False
        if h in self.by_hash:
            return False
        self.by_hash[h] = block
        self._hash[block] = h
        self._state[block] = _HELD
        return True

    def park(self, block: int, model: str) -> bool:
        """The last holder of ``block`` (of ``model``) let it go: a cached block becomes idle (True),
        else False."""
        state = self._state
        if block >= len(state) or not state[block]:
            return False
        state[block] = _IDLE
        mid = self._model_ids.get(model)
        if mid is None:
            mid = self._model_ids[model] = len(self._models)
            self._models.append(model)
        self._model[block] = mid
        self._append(block)
        self.idle_count += 1
        self.idle_by_model[model] = self.idle_by_model.get(model, 0) + 1
        return True

    def claim(self, block: int) -> bool:
        """A sequence takes the cached ``block``: True when it was idle (it is no longer)."""
        state = self._state
        if block >= len(state) or state[block] != _IDLE:
            return False
        state[block] = _HELD
        self._unlink(block)
        self._idle_less(block)
        return True

    def evict(self) -> int:
        """Forget the least recently idled block and return it (the caller reuses it)."""
        block = self._head
        if block < 0:
            raise KeyError("no idle cached block to evict")
        self._unlink(block)
        self._forget(block)
        return block

    def drop_model(self, model: str) -> list[int]:
        """Forget ``model``'s cached blocks (all idle: it has no sequences); returns them, least
        recently idled first."""
        mid = self._model_ids.get(model)
        if mid is None or not self.idle_by_model.get(model):
            return []
        blocks = []
        nxt, models = self._next, self._model
        b = self._head
        while b >= 0:
            after = nxt[b]
            if models[b] == mid:
                self._unlink(b)
                self._forget(b)
                blocks.append(b)
            b = after
        return blocks

    def _grow(self, block: int) -> None:
        """Room for ``block`` in the per-block arrays (doubling, at most the pool's blocks)."""
        have = len(self._state)
        size = min(self._limit, max(block + 1, 2 * have, 1024))
        if block >= size:
            raise IndexError(f"block {block} outside [0, {self._limit})")
        extra = size - have
        for arr in (self._hash, self._state, self._model):
            arr.frombytes(bytes(extra * arr.itemsize))
        for arr in (self._prev, self._next):
            arr.frombytes(b"\xff" * (extra * arr.itemsize))  # -1

    def _append(self, block: int) -> None:
        """``block`` becomes the most recently idled."""
        tail = self._tail
        self._prev[block] = tail
        self._next[block] = -1
        if tail < 0:
            self._head = block
        else:
            self._next[tail] = block
        self._tail = block

    def _unlink(self, block: int) -> None:
        prev, nxt = self._prev[block], self._next[block]
        if prev < 0:
            self._head = nxt
        else:
            self._next[prev] = nxt
        if nxt < 0:
            self._tail = prev
        else:
            self._prev[nxt] = prev

    def _forget(self, block: int) -> None:
        """The idle ``block`` (unlinked) is no longer cached."""
        del self.by_hash[self._hash[block]]
        self._state[block] = _UNCACHED
        self._idle_less(block)

    def _idle_less(self, block: int) -> None:
        self.idle_count -= 1
        model = self._models[self._model[block]]
        left = self.idle_by_model[model] - 1
        if left:
            self.idle_by_model[model] = left
        else:
            del self.idle_by_model[model]
