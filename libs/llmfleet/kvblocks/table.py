"""Where a sequence's tokens live in the unified KV pool: a token's :class:`Slot` and a sequence's
:class:`BlockTable` snapshot (plain data the allocator hands out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


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
