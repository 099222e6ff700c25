"""The pool's free blocks, compactly: ids never handed out are a high-water mark, not a list.

``pop`` hands out the most recently freed block first (LIFO), else the lowest id never used, so a
fresh pool hands out 0, 1, 2, ... and a freed block is reused first. Freed ids are an ``array`` of
8-byte ints: a pool of millions of blocks costs nothing until its blocks are used, and 8 bytes per
freed block after (a list of Python ints costs about 36).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable


class FreeBlocks:
    """The free block ids of a pool of ``num_blocks`` blocks (all free at first)."""

    __slots__ = ("_fresh", "_num_blocks", "_stack")

    def __init__(self, num_blocks: int) -> None:
        self._num_blocks = num_blocks
        self._fresh = 0  # ids >= this were never handed out
        self._stack = array("q")  # freed ids, the next to hand out last

    def __len__(self) -> int:
        return len(self._stack) + self._num_blocks - self._fresh

    def __contains__(self, block: int) -> bool:
        return block >= self._fresh or block in self._stack

    def pop(self) -> int:
        """One free block (IndexError when there is none)."""
        if self._stack:
            return self._stack.pop()
        b = self._fresh
        if b >= self._num_blocks:
            raise IndexError("no free block")
        self._fresh = b + 1
        return b

    def take(self, n: int) -> list[int]:
        """``n`` free blocks (the caller checked there are), in the order ``pop`` would give them."""
        stack = self._stack
        k = min(n, len(stack))
        out = stack[len(stack) - k :].tolist()
        del stack[len(stack) - k :]
        out.reverse()
        if n > k:
            b = self._fresh
            out.extend(range(b, b + n - k))
            self._fresh = b + n - k
        return out

    def append(self, block: int) -> None:
        self._stack.append(block)

    def extend(self, blocks: Iterable[int]) -> None:
        """Free ``blocks``; the last one is handed out first."""
        self._stack.extend(blocks)
