"""The physical unified KV pool (SeaLLM §5): one byte tensor of merged blocks, typed views per model.

The pool is ONE ``torch.uint8`` tensor ``[num_blocks, block_bytes]``. Every registered model sees the
whole pool through a zero-copy typed view ``[num_blocks, L, 2, H_kv, T_m, D]`` (its dtype): block ``b``
of the pool, read by model ``m``, is model ``m``'s slab of ``T_m = tokens_per_block(block_bytes)``
tokens for all layers, K and V, all KV heads. The first ``T_m · bytes_per_token`` bytes of a block are
the slab, the tail is unused. Which model owns which block is the allocator's business (block tables,
``allocator.py``); this module only moves bytes, addressed by explicit block ids and slots
``(block, offset)``.

Export/import use a canonical, block-size independent layout ``[L, 2, H_kv, n, D]`` (the model dtype,
C-contiguous, little-endian), so KV moves between pools with different ``block_bytes`` (different
``T_m``), e.g. engines of a migration.

Hot-path methods (``write``, ``gather``, ``layer_view``) do not range-check block ids on the device
(that would synchronise a GPU); the cold-path methods (export/import/copy) do.

The pool starts zeroed, but a slot a sequence has not written (e.g. the tail of its last block) holds
whatever the block held before, possibly another model's bytes that read as NaN in this dtype. Readers
must never let such slots reach the math: ``gather`` returns exactly ``num_tokens`` tokens, and the
paged runner crops/zeroes them (see ``llmfleet_engine.native.attention``).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llmfleet.kvblocks.shapes import KvShape

BLOCK_ALIGN = 16
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}

Ids = Sequence[int] | torch.Tensor


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.float16`` / ``"float16"`` -> ``"float16"`` (the ``KvShape.dtype`` spelling)."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name not in TORCH_DTYPES:
        raise ValueError(f"unsupported KV dtype {dtype!r}; valid: {sorted(TORCH_DTYPES)}")
    return name


@dataclass(frozen=True)
class _ModelView:
    shape: KvShape
    tokens_per_block: int
    dtype: torch.dtype
    view: torch.Tensor  # [N, L, 2, H, T, D]
    token_major: torch.Tensor  # [N, L, T, 2, H, D] (the same memory, permuted)


class KvStorage:
    """One byte pool of ``num_blocks`` merged blocks of ``block_bytes`` each, on ``device``."""

    def __init__(self, num_blocks: int, block_bytes: int, device: str | torch.device = "cpu") -> None:
        if int(num_blocks) <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        if int(block_bytes) <= 0 or int(block_bytes) % BLOCK_ALIGN:
            raise ValueError(f"block_bytes must be a positive multiple of {BLOCK_ALIGN}, got {block_bytes}")
        self._num_blocks = int(num_blocks)
        self._block_bytes = int(block_bytes)
        # Uninitialised on purpose: the runner never reads a slot before writing it, and on CPU the OS
        # commits pages only when they are first written, so an idle pool costs no memory.
        self._pool = torch.empty(self._num_blocks, self._block_bytes, dtype=torch.uint8, device=device)
        self._models: dict[str, _ModelView] = {}

    # ------------------------------------------------------------------ facts
    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_bytes(self) -> int:
        return self._block_bytes

    @property
    def nbytes(self) -> int:
        return self._num_blocks * self._block_bytes

    @property
    def device(self) -> torch.device:
        return self._pool.device

    @property
    def pool(self) -> torch.Tensor:
        """The raw ``uint8 [num_blocks, block_bytes]`` tensor."""
        return self._pool

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._models)

    def __contains__(self, model: object) -> bool:
        return model in self._models

    def shape(self, model: str) -> KvShape:
        return self._get(model).shape

    def tokens_per_block(self, model: str) -> int:
        """T_m of a registered model in this pool."""
        return self._get(model).tokens_per_block

    # ------------------------------------------------------------ registration
    def register(self, model: str, shape: KvShape) -> torch.Tensor:
        """Create (or return, when already registered with the same shape) the model's typed view.

        Returns the view ``[num_blocks, L, 2, H_kv, T_m, D]`` of the pool (no copy).
        """
        if not model:
            raise ValueError("model name is empty")
        existing = self._models.get(model)
        if existing is not None:
            if existing.shape != shape:
                raise ValueError(f"model {model!r} is already registered with {existing.shape}, not {shape}")
            return existing.view
        t = shape.tokens_per_block(self._block_bytes)
        dtype = TORCH_DTYPES[dtype_name(shape.dtype)]
        item = shape.dtype_bytes
        L, H, D = shape.num_layers, shape.num_kv_heads, shape.head_dim
        flat = self._pool.view(-1).view(dtype)  # block_bytes % 16 == 0, so rows stay aligned
        size = (self._num_blocks, L, 2, H, t, D)
        stride = (self._block_bytes // item, 2 * H * t * D, H * t * D, t * D, D, 1)
        view = flat.as_strided(size, stride)
        self._models[model] = _ModelView(shape, t, dtype, view, view.permute(0, 1, 4, 2, 3, 5))
        return view

    def unregister(self, model: str) -> None:
        self._get(model)
        del self._models[model]

    def view(self, model: str) -> torch.Tensor:
        """The model's typed view ``[num_blocks, L, 2, H_kv, T_m, D]``."""
        return self._get(model).view

    def layer_view(self, model: str, layer: int) -> torch.Tensor:
        """Token-major view of one layer, ``[num_blocks, T_m, 2, H_kv, D]`` (no copy).

        ``layer_view(m, l)[blocks, offsets]`` reads ``[n, 2, H, D]`` (K and V of n slots) in one
        indexing op, and assigning to it writes them: what the paged runner uses per layer.
        """
        return self._get(model).token_major[:, layer]

    # --------------------------------------------------------------- hot path
    @torch.inference_mode()
    def write(
        self,
        model: str,
        layer: int,
        slots_block: torch.Tensor,
        slots_offset: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """Scatter K/V ``[n, H_kv, D]`` of n tokens into slots ``(slots_block[i], slots_offset[i])``."""
        mv = self._get(model)
        n = k.shape[0]
        if v.shape != k.shape or k.dim() != 3 or slots_block.numel() != n or slots_offset.numel() != n:
            raise ValueError(
                f"write: k {tuple(k.shape)}, v {tuple(v.shape)}, {slots_block.numel()} blocks and "
                f"{slots_offset.numel()} offsets do not describe the same n tokens of [n, H, D]"
            )
        lv = mv.token_major[:, layer]
        lv[slots_block.to(self.device), slots_offset.to(self.device)] = torch.stack((k, v), dim=1).to(
            mv.dtype
        )

    @torch.inference_mode()
    def gather(
        self, model: str, layer: int, blocks: Ids, num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ``[H_kv, num_tokens, D]`` of one sequence whose block table is ``blocks``."""
        mv = self._get(model)
        blocks_t = torch.as_tensor(blocks, dtype=torch.long, device=self.device).reshape(-1)
        nb = blocks_t.numel()
        if num_tokens < 0 or num_tokens > nb * mv.tokens_per_block:
            raise ValueError(f"gather: {num_tokens} tokens do not fit {nb} blocks of {mv.tokens_per_block}")
        kv = mv.view[:, layer].index_select(0, blocks_t)  # [nb, 2, H, T, D]
        kv = kv.permute(1, 2, 0, 3, 4).reshape(2, mv.shape.num_kv_heads, nb * mv.tokens_per_block, -1)
        kv = kv[:, :, :num_tokens]
        return kv[0], kv[1]

    # -------------------------------------------------------------- block ops
    def copy_block(self, src: int, dst: int) -> None:
        """Copy all bytes of block ``src`` to block ``dst`` (copy-on-write forks)."""
        self._check_ids([src, dst])
        self._pool[dst].copy_(self._pool[src])

    def copy_blocks(self, src: Ids, dst: Ids) -> None:
        """Vectorised ``copy_block`` for pairs ``src[i] -> dst[i]`` (dst ids must be distinct)."""
        src_t = self._checked_ids(src)
        dst_t = self._checked_ids(dst)
        if src_t.numel() != dst_t.numel():
            raise ValueError(f"copy_blocks: {src_t.numel()} sources but {dst_t.numel()} destinations")
        self._pool[dst_t] = self._pool[src_t]

    # ---------------------------------------------------------- export/import
    def bytes_for_tokens(self, model: str, num_tokens: int) -> int:
        """Length of an ``export_tokens`` chunk of ``num_tokens`` tokens."""
        return num_tokens * self._get(model).shape.bytes_per_token

    @torch.inference_mode()
    def export_tokens(self, model: str, blocks: Ids, start: int, end: int) -> bytes:
        """Tokens ``[start, end)`` of a sequence as canonical bytes ``[L, 2, H_kv, n, D]`` (model dtype)."""
        mv = self._get(model)
        blk, off = self._token_slots(mv, blocks, start, end)
        data = mv.view[blk, :, :, :, off]  # separated advanced indices first: [n, L, 2, H, D]
        data = data.permute(1, 2, 3, 0, 4).contiguous()
        return _to_le_bytes(data)

    @torch.inference_mode()
    def import_tokens(
        self,
        model: str,
        blocks: Ids,
        start: int,
        data: bytes | bytearray | memoryview,
        num_tokens: int | None = None,
    ) -> int:
        """Write a canonical chunk (see ``export_tokens``) to positions ``[start, start+n)``.

        ``blocks`` is the destination sequence's block table (it may use another ``block_bytes`` than the
        exporting pool). Returns n. Raises ``ValueError`` when the byte length does not match the
        model's shape (or ``num_tokens`` when given) or the blocks cannot hold the range.
        """
        mv = self._get(model)
        size = memoryview(data).nbytes
        bpt = mv.shape.bytes_per_token
        if size % bpt or (num_tokens is not None and size != num_tokens * bpt):
            want = f"{num_tokens} tokens × {bpt}" if num_tokens is not None else f"a multiple of {bpt}"
            raise ValueError(f"KV chunk for {model!r} ({mv.shape}) has {size} bytes, expected {want} bytes")
        n = size // bpt
        if n == 0:
            return 0
        if sys.byteorder != "little" and mv.shape.dtype_bytes > 1:
            raise NotImplementedError("KV export/import needs a little-endian host")
        blk, off = self._token_slots(mv, blocks, start, start + n)
        with warnings.catch_warnings():  # read-only buffers are fine: the data is copied, never written
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(data, dtype=torch.uint8)
        s = mv.shape
        chunk = raw.to(self.device).view(mv.dtype).view(s.num_layers, 2, s.num_kv_heads, n, s.head_dim)
        mv.view[blk, :, :, :, off] = chunk.permute(3, 0, 1, 2, 4)
        return n

    # --------------------------------------------------------------- helpers
    def _get(self, model: str) -> _ModelView:
        try:
            return self._models[model]
        except KeyError:
            raise KeyError(f"model {model!r} is not registered in this KV storage") from None

    def _checked_ids(self, ids: Ids) -> torch.Tensor:
        t = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        if t.numel():
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= self._num_blocks:
                raise IndexError(f"block ids must lie in [0, {self._num_blocks}), got [{lo}, {hi}]")
        return t.to(self.device)

    def _check_ids(self, ids: Sequence[int]) -> None:
        for b in ids:
            if not 0 <= int(b) < self._num_blocks:
                raise IndexError(f"block id {b} outside [0, {self._num_blocks})")

    def _token_slots(
        self, mv: _ModelView, blocks: Ids, start: int, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        table = self._checked_ids(blocks)
        t = mv.tokens_per_block
        if not 0 <= start <= end <= table.numel() * t:
            raise ValueError(
                f"token range [{start}, {end}) outside {table.numel()} blocks of {t} tokens "
                f"({table.numel() * t} slots)"
            )
        pos = torch.arange(start, end, device=self.device)
        return table[pos // t], pos % t


def _to_le_bytes(t: torch.Tensor) -> bytes:
    if sys.byteorder != "little" and t.element_size() > 1:
        raise NotImplementedError("KV export/import needs a little-endian host")
    return t.cpu().view(torch.uint8).numpy().tobytes()
