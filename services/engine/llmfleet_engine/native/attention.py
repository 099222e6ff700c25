"""Paged attention over ``KvStorage``: per-iteration plans and the per-layer attention step.

A batch is laid out decode-first: the ``B`` single-token sequences (decodes) occupy rows ``[0, B)`` of
the flat ``[T_total, ...]`` activation, then each multi-token sequence (prompt or prompt chunk) has its
own contiguous segment. Per layer:

1. the step's new K/V of all tokens are written to their slots with ONE indexed assignment;
2. every block the step reads is fetched with ONE ``index_select`` over whole blocks, along the block
   dim of the ``[2, H_kv, N, T_m, D]`` view: it copies ``T_m · D`` contiguous slabs (on CPU 4x faster
   than a token-level gather at 512 tokens of context) and lands consecutive blocks of a sequence
   next to each other, so ``[.., nb · T_m, D]`` keys are a view, no second layout copy; the block
   indices are computed once per iteration for all layers (when every decode lives in one block and
   nothing else reads the pool, only the written prefix ``[0, max context)`` of each block is copied);
3. decodes run as ONE padded ``scaled_dot_product_attention`` call ``[B, H, 1, D] × [B, H_kv, C, D]``
   with a key-padding mask; every multi-token segment (and a lone decode) runs its own SDPA call over
   exactly its keys, with a causal mask offset by ``start_pos`` (``is_causal`` when it starts at 0).

Slots of a block that the sequence has not written (the tail of its last block) may hold anything,
e.g. another model's data that reads as NaN in this dtype. Masking does not neutralise NaN
(``NaN + -inf`` is NaN), so such keys never reach SDPA: exact segments slice them away; the padded
decode group right-aligns each row's blocks, pads in front with a block that is fully written (the first
block of the longest row) and zeroes the unwritten slots of the last column only (a small masked fill,
instead of a full ``where`` over all keys).

A segment starting at position 0 attends to its freshly computed K/V directly: those are exactly the
values just written to the pool, so reading them back would only cost a copy.

Sliding windows (Mistral, Qwen2 sliding layers) are applied in the mask, with HF's semantics: a query
at position p sees keys k with ``p - W < k <= p``; blocks entirely older than the window are not read.

Planning is host work in plain Python: ``build_plan`` puts its index lists (block ids to gather, the
decode rows' key ranges) into the iteration's :class:`Packer`, whose ONE host tensor carries every
index of the forward to the device in one copy; ``AttnPlan.bind`` then takes views of it and builds
the few masks that need tensor ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa


class Packer:
    """Integer lists of one forward, packed into ONE host tensor and copied to the device once."""

    def __init__(self) -> None:
        self._data: list[int] = []
        self._spans: list[tuple[int, int]] = []

    def add(self, values: list[int]) -> int:
        """Register ``values``; returns its index into :meth:`tensors`' result."""
        self._spans.append((len(self._data), len(values)))
        self._data += values
        return len(self._spans) - 1

    def tensors(self, device: torch.device) -> list[torch.Tensor]:
        packed = torch.tensor(self._data, dtype=torch.long)
        if packed.device != device:
            packed = packed.to(device, non_blocking=True)
        return [packed[a : a + n] for a, n in self._spans]


@dataclass
class Segment:
    """Rows ``[a, b)`` of the batch with keys fresh, or at blocks ``[g0, g1)`` of the gather output.

    ``lo``/``hi`` slice the keys out of the gathered blocks' ``g_n · T_m`` positions.
    """

    a: int
    b: int
    fresh: bool
    g0: int = 0
    g1: int = 0
    lo: int = 0
    hi: int = 0
    mask: torch.Tensor | None = None  # bool [q, k]
    is_causal: bool = False
    count: int = 1  # > 1: that many consecutive fresh causal prompts of equal length, ONE batched call


@dataclass
class AttnPlan:
    """Everything attention needs for one iteration and one window value, shared by its layers."""

    num_decode: int = 0  # padded decode group size (0: none, or a lone decode handled as a segment)
    decode_blocks: int = 0  # blocks per decode row (nb_max)
    decode_keys: tuple[int, int] = (0, 0)  # the crop [lo, hi) of the nb_max · T_m key columns
    decode_mask: torch.Tensor | None = None  # bool [B, 1, 1, hi - lo]; None: every cropped key is valid
    decode_tail: torch.Tensor | None = None  # bool [B, S, 1]: unwritten slots of each last block (S read)
    decode_crop: int | None = None  # gather only slots [0, crop) of each block (one block per decode)
    segments: list[Segment] = field(default_factory=list)
    gather: torch.Tensor | None = None  # [G] block ids
    # host side, until bind(): Packer indices of the gather list and of the decode rows' key ranges
    _gather_at: int | None = None
    _meta_at: int | None = None
    _mask: bool = False
    _tail: bool = False
    _tokens_per_block: int = 0

    def bind(self, packed: list[torch.Tensor], device: torch.device) -> AttnPlan:
        """Take the plan's index tensors out of the packed forward indices; build the decode masks."""
        if self._gather_at is not None:
            self.gather = packed[self._gather_at]
        if self._meta_at is not None:
            nd = self.num_decode
            v_lo, v_hi, tail = packed[self._meta_at].view(3, nd, 1)
            if self._mask:
                j = torch.arange(*self.decode_keys, device=device)
                self.decode_mask = ((j >= v_lo) & (j < v_hi)).view(nd, 1, 1, -1)
            if self._tail:  # only the last column's slots inside the key crop are read
                slots = self.decode_keys[1] - (self.decode_blocks - 1) * self._tokens_per_block
                self.decode_tail = (torch.arange(slots, device=device) >= tail).view(nd, slots, 1)
        return self


@dataclass
class BatchLayout:
    """Host facts of one iteration in internal (decode-first) order."""

    q_len: list[int]
    start: list[int]
    tok_off: list[int]  # first row of each sequence in the flat batch
    tbl_off: list[int]  # first entry of each sequence in the flat block table
    num_decode: int
    table: list[int]  # flat concatenated block tables (host)
    tokens_per_block: int


def _window_lo(pos: int, window: int | None) -> int:
    return 0 if window is None else max(0, pos - window + 1)


def _mask(qpos: torch.Tensor, kpos: torch.Tensor, window: int | None) -> torch.Tensor:
    m = kpos[None, :] <= qpos[:, None]
    if window is not None:
        m &= kpos[None, :] > qpos[:, None] - window
    return m


def build_plan(layout: BatchLayout, window: int | None, pack: Packer, device: torch.device) -> AttnPlan:
    """The attention plan of one iteration and one sliding window value (shared by its layers); its
    index lists go into ``pack`` (``bind`` it to the packed tensors before use)."""
    plan = AttnPlan(_tokens_per_block=layout.tokens_per_block)
    gather: list[int] = []
    first_segment = 0
    if layout.num_decode >= 2:
        _plan_decode_group(layout, window, pack, plan, gather)
        first_segment = layout.num_decode
    for i in range(first_segment, len(layout.q_len)):
        seg = _plan_segment(layout, i, window, plan, gather, device)
        if seg is not None:
            plan.segments.append(seg)
    if gather:
        plan._gather_at = pack.add(gather)
    return plan


def _plan_decode_group(
    layout: BatchLayout, window: int | None, pack: Packer, plan: AttnPlan, gather: list[int]
) -> None:
    """The padded decode group (two decodes or more): its blocks into ``gather``, its crop and masks
    into ``plan``."""
    t_m, table, nd = layout.tokens_per_block, layout.table, layout.num_decode
    # Row i holds its blocks right-aligned in nb_max columns; the last column is each row's last
    # (possibly partial) block, the front padding repeats a FULL block (the first block of the
    # longest row), so only the last column can hold bytes the row has not written.
    starts, offs = layout.start[:nd], layout.tbl_off[:nd]
    lo = [_window_lo(p, window) for p in starts] if window is not None else [0] * nd
    b0 = [x // t_m for x in lo]
    nb = [(p + t_m) // t_m - b for p, b in zip(starts, b0, strict=True)]  # ceil((p + 1) / t_m) - b0
    nb_max = max(nb)
    if nb_max == 1:
        gather += [table[o + b] for o, b in zip(offs, b0, strict=True)]
        v_lo = [x - b * t_m for x, b in zip(lo, b0, strict=True)]  # valid keys: [v_lo, v_hi)
        v_hi = [p + 1 - b * t_m for p, b in zip(starts, b0, strict=True)]
        tail = v_hi
    else:
        longest = table[offs[nb.index(nb_max)] + b0[nb.index(nb_max)]]
        v_lo, v_hi, tail = [], [], []
        for p, o, x, b, n in zip(starts, offs, lo, b0, nb, strict=True):
            pad = nb_max - n
            if pad:
                gather += [longest] * pad
            gather += table[o + b : o + b + n]
            v_lo.append(pad * t_m + x - b * t_m)
            v_hi.append(pad * t_m + p + 1 - b * t_m)
            tail.append(p + 1 - (b + n - 1) * t_m)  # written slots of the last block
    plan.num_decode, plan.decode_blocks = nd, nb_max
    # keys outside [min v_lo, max v_hi) are cropped away; inside, rows that differ need a mask
    k_lo, k_hi = min(v_lo), max(v_hi)
    plan.decode_keys = (k_lo, k_hi)
    plan._mask = max(v_lo) > k_lo or min(v_hi) < k_hi
    plan._tail = min(v_hi) < k_hi  # some row's unwritten tail lies inside the crop
    if plan._mask or plan._tail:
        plan._meta_at = pack.add(v_lo + v_hi + tail)
    if nb_max == 1:
        plan.decode_crop = k_hi  # unless a segment gathers too (below)


def _plan_segment(
    layout: BatchLayout, i: int, window: int | None, plan: AttnPlan, gather: list[int], device: torch.device
) -> Segment | None:
    """Sequence ``i``'s own SDPA call (its pool blocks into ``gather`` unless its keys are fresh); None
    when it joins the batched call of the equal fresh prompt before it."""
    t_m = layout.tokens_per_block
    n, start = layout.q_len[i], layout.start[i]
    a = layout.tok_off[i]
    seg = Segment(a=a, b=a + n, fresh=start == 0)
    if seg.fresh:
        if window is None or window >= n:
            seg.is_causal = True
            prev = plan.segments[-1] if plan.segments else None
            if (
                prev is not None
                and prev.is_causal
                and prev.fresh
                and prev.b == a
                and prev.b - prev.a == n * prev.count
            ):
                prev.b, prev.count = a + n, prev.count + 1  # joins the batched call of its equals
                return None
        else:
            qpos = torch.arange(n, device=device)
            seg.mask = _mask(qpos, qpos, window)
        return seg
    end = start + n
    lo_ = _window_lo(start, window)
    s0, s1 = lo_ // t_m, -(-end // t_m)
    seg.g0 = len(gather)
    gather += layout.table[layout.tbl_off[i] + s0 : layout.tbl_off[i] + s1]
    seg.g1 = len(gather)
    seg.lo, seg.hi = lo_ - s0 * t_m, end - s0 * t_m
    plan.decode_crop = None  # the segment reads whole blocks of the same gather
    if n > 1:  # a lone decode sees exactly its keys [lo, end): no mask at all
        qpos = torch.arange(start, end, device=device)
        seg.mask = _mask(qpos, torch.arange(lo_, end, device=device), window)
    return seg


def paged_attention(
    layer_slots: torch.Tensor,
    layer_blocks: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    write_block: torch.Tensor,
    write_offset: torch.Tensor,
    plan: AttnPlan,
    scale: float,
) -> torch.Tensor:
    """Attention of one layer for the whole batch; returns ``[T, H, D]``.

    ``layer_slots`` is the storage's token-major layer view ``[N, T_m, 2, H_kv, D]`` (for writes),
    ``layer_blocks`` the block-major one ``[N, 2, H_kv, T_m, D]`` (for reads); ``q`` ``[T, H, D]``,
    ``k``/``v`` ``[T, H_kv, D]`` with RoPE applied.
    """
    layer_slots[write_block, write_offset] = torch.stack((k, v), dim=1)
    gqa = q.shape[1] != k.shape[1]
    # ONE copy: index_select along the block dim of the [2, H, N, T, D] permuted view puts each gathered
    # block's T·D slab contiguously, so consecutive blocks of a row merge into [.., nb·T, D] by a view.
    x = None
    if plan.gather is not None:
        src = layer_blocks if plan.decode_crop is None else layer_blocks[:, :, :, : plan.decode_crop]
        x = src.permute(1, 2, 0, 3, 4).index_select(2, plan.gather)
    outs: list[torch.Tensor] = []
    if plan.num_decode:
        nd, nb = plan.num_decode, plan.decode_blocks
        assert x is not None  # decode rows read cached blocks: the plan gathers them
        two, h, _, t_m, d = x.shape
        xd = x[:, :, : nd * nb].view(two, h, nd, nb, t_m, d)
        if plan.decode_tail is not None:  # unwritten slots may hold any bytes (NaN): zero them
            xd[:, :, :, -1, : plan.decode_tail.shape[1]].masked_fill_(plan.decode_tail, 0)
        k_lo, k_hi = plan.decode_keys
        kv = xd.view(two, h, nd, nb * t_m, d)[:, :, :, k_lo:k_hi].transpose(1, 2)  # [2, B, H_kv, C, D]
        o = sdpa(q[:nd].unsqueeze(2), kv[0], kv[1], attn_mask=plan.decode_mask, scale=scale, enable_gqa=gqa)
        outs.append(o.squeeze(2))
    for seg in plan.segments:
        if seg.count > 1:  # [count, H, n, D]: prompts of equal length from position 0, batched
            m, n = seg.count, (seg.b - seg.a) // seg.count
            qs, ks, vs = (x[seg.a : seg.b].view(m, n, x.shape[1], -1).transpose(1, 2) for x in (q, k, v))
            o = sdpa(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa)
            outs.append(o.transpose(1, 2).reshape(seg.b - seg.a, q.shape[1], -1))
            continue
        qs = q[seg.a : seg.b].transpose(0, 1)
        if seg.fresh:
            ks, vs = k[seg.a : seg.b].transpose(0, 1), v[seg.a : seg.b].transpose(0, 1)
        else:
            assert x is not None  # a segment with cached keys: the plan gathers its blocks
            two, h, _, t_m, d = x.shape
            kv = x[:, :, seg.g0 : seg.g1].reshape(two, h, -1, d)[:, :, seg.lo : seg.hi]
            ks, vs = kv[0], kv[1]
        # 4-D inputs: on CPU a 3-D call misses the fused kernel (and rounds differently in bf16)
        o = sdpa(
            qs[None],
            ks[None],
            vs[None],
            attn_mask=seg.mask,
            is_causal=seg.is_causal,
            scale=scale,
            enable_gqa=gqa,
        )
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs) if len(outs) > 1 else outs[0]
