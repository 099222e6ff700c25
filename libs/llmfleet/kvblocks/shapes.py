"""Per-model KV geometry and SeaLLM's merged-block arithmetic (SeaLLM §5, "unified KV cache").

One physical block of ``block_bytes`` holds one model's K and V for all layers and all KV heads of
``T_m = floor(block_bytes / bytes_per_token)`` tokens, so models with different shapes share blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


@dataclass(frozen=True)
class KvShape:
    """KV geometry of one model: layers, KV heads (GQA), head dim and the cache dtype."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if min(self.num_layers, self.num_kv_heads, self.head_dim) <= 0:
            raise ValueError(f"KvShape dimensions must be positive: {self}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unsupported KV dtype {self.dtype!r}; valid: {sorted(DTYPE_BYTES)}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def elements_per_token(self) -> int:
        """K and V of one token over all layers and KV heads: 2 · L · H_kv · D."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def bytes_per_token(self) -> int:
        return self.elements_per_token * self.dtype_bytes

    def tokens_per_block(self, block_bytes: int) -> int:
        """T_m = floor(B / kv_bytes_per_token); a block that cannot hold one token is an error."""
        t = block_bytes // self.bytes_per_token
        if t < 1:
            raise ValueError(
                f"block of {block_bytes} bytes cannot hold one token of {self} ({self.bytes_per_token} bytes/token)"
            )
        return t

    def blocks_for(self, num_tokens: int, block_bytes: int) -> int:
        """Blocks needed for ``num_tokens`` tokens (ceil division)."""
        t = self.tokens_per_block(block_bytes)
        return -(-num_tokens // t)
