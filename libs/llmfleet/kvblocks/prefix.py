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
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from hashlib import blake2b

RECENT_HASHES = 256  # recently cached block hashes a load report carries (bounded)

__all__ = ["RECENT_HASHES", "PrefixIndex", "block_hash", "prefix_block_hashes"]


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

    A cached block is an entry in ``by_hash`` and in ``of_block`` (two ints, shared by both dicts); an
    idle one also an entry in ``idle``, whose value is its model (the names are shared strings). A
    block's model is needed only while it is idle: a held block's model is its holders'.
    """

    __slots__ = ("by_hash", "idle", "idle_by_model", "of_block", "recent")

    def __init__(self) -> None:
        self.by_hash: dict[int, int] = {}  # hash -> block
        self.of_block: dict[int, int] = {}  # block -> hash
        self.idle: OrderedDict[int, str] = OrderedDict()  # cached blocks no sequence holds -> model
        self.idle_by_model: dict[str, int] = {}
        self.recent: deque[int] = deque(maxlen=RECENT_HASHES)

    def __len__(self) -> int:
        return len(self.of_block)

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
        by_hash, idle = self.by_hash, self.idle
        moved = 0
        for h in reversed(hashes[: self.match(hashes)]):
            block = by_hash[h]
            if block in idle:
                idle.move_to_end(block)
                moved += 1
        return moved

    def add(self, block: int, h: int) -> bool:
        """Name the held ``block`` by ``h``; False when the block or the hash is already cached."""
        if block in self.of_block or h in self.by_hash:
            return False
        self.by_hash[h] = block
        self.of_block[block] = h
        self.recent.append(h)
        return True

    def park(self, block: int, model: str) -> bool:
        """The last holder of ``block`` (of ``model``) let it go: a cached block becomes idle (True),
        else False."""
        if block not in self.of_block:
            return False
        self.idle[block] = model
        self.idle_by_model[model] = self.idle_by_model.get(model, 0) + 1
        return True

    def claim(self, block: int) -> bool:
        """A sequence takes the cached ``block``: True when it was idle (it is no longer)."""
        model = self.idle.pop(block, None)
        if model is None:
            return False
        self._idle_less(model)
        return True

    def evict(self) -> int:
        """Forget the least recently idled block and return it (the caller reuses it)."""
        block, model = self.idle.popitem(last=False)
        del self.by_hash[self.of_block.pop(block)]
        self._idle_less(model)
        return block

    def drop_model(self, model: str) -> list[int]:
        """Forget ``model``'s cached blocks (all idle: it has no sequences); returns them."""
        idle = self.idle
        blocks = [b for b in self.of_block if idle.get(b) == model]  # in the order they were cached
        for b in blocks:
            del self.by_hash[self.of_block.pop(b)]
            del idle[b]
        self.idle_by_model.pop(model, None)
        return blocks

    def _idle_less(self, model: str) -> None:
        left = self.idle_by_model[model] - 1
        if left:
            self.idle_by_model[model] = left
        else:
            del self.idle_by_model[model]
