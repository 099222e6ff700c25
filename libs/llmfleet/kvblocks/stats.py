"""Accounting snapshots of the unified KV pool (plain frozen dataclasses, no behaviour)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ModelUsage:
    """One model's share of the pool.

    ``blocks`` counts distinct physical blocks (a block shared by forked sequences or prefix-cache hits
    counts once), ``tokens`` the tokens physically stored in them (shared tokens count once, so this is
    not the sum of the sequences' lengths), ``sequences`` the live sequences and ``token_capacity`` =
    blocks · T_m. ``cached_blocks``: the model's idle cached blocks, which no sequence holds (not in
    ``blocks``: they are free for any allocation).
    """

    blocks: int
    tokens: int
    sequences: int
    token_capacity: int
    cached_blocks: int = 0


@dataclass(frozen=True, slots=True)
class PoolStats:
    """A snapshot of the whole pool.

    ``internal_fragmentation_bytes`` sums, over allocated blocks, the bytes not holding a token:
    ``block_bytes - used_tokens · bytes_per_token``; this includes the tail that T_m leaves unused in
    every block of a model whose token size does not divide ``block_bytes``. ``fragmentation`` is that
    over ``used_blocks · block_bytes`` (0 when nothing is used), ``utilization`` = used / total blocks.
    ``cached_blocks`` of the ``free_blocks`` are idle prefix-cache blocks (reclaimed when needed).
    """

    total_blocks: int
    free_blocks: int
    used_blocks: int
    block_bytes: int
    watermark_blocks: int
    num_sequences: int
    models: dict[str, ModelUsage] = field(default_factory=dict)
    internal_fragmentation_bytes: int = 0
    fragmentation: float = 0.0
    utilization: float = 0.0
    cached_blocks: int = 0

    @property
    def used_bytes(self) -> int:
        return self.used_blocks * self.block_bytes

    @property
    def total_bytes(self) -> int:
        return self.total_blocks * self.block_bytes


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """The prefix cache of a pool: ``blocks`` cached (held or idle), ``idle_blocks`` of them no
    sequence holds."""

    blocks: int
    idle_blocks: int
