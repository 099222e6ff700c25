"""Roofline latency defaults for a model on a hardware type at tensor-parallel degree N.

Used before any profile exists. Each phase costs max(compute, memory) + all-reduce:

- prefill FLOPs = 2·P_mm·T + 2·L·(H·d)·Σ l_i²   (P_mm: matmul parameters incl. lm_head; the second term
  is causal attention, QKᵀ and AV at 2·l²·H·d each, halved by the mask)
- prefill bytes = W + T·kv_bytes_per_token       (weights read once, KV written)
- decode FLOPs  = 2·P_mm·b + 4·L·(H·d)·b·l       (each new token attends to l cached tokens)
- decode bytes  = W + b·l·kv_bytes_per_token    (weights and the whole KV cache read each iteration)
- compute time  = FLOPs / (N·peak·compute_eff);  memory time = bytes / (N·bw·mem_eff)
- all-reduce    = 2·L all-reduces of T·h·dtype_bytes each (Megatron: after attention and after MLP),
                  ring cost 2(N−1)/N·bytes / (link_bw·comm_eff); 0 for N = 1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmfleet.costmodel.hardware import Hardware
from llmfleet.costmodel.models import ModelArch


def _check(tp: int, *counts: float) -> None:
    if tp < 1:
        raise ValueError(f"tensor-parallel degree must be ≥ 1, got {tp}")
    if min(counts) < 0:
        raise ValueError(f"token and batch counts must be ≥ 0, got {counts}")


def allreduce_time(arch: ModelArch, hw: Hardware, tokens: float, tp: int = 1) -> float:
    """2·L ring all-reduces of tokens·h·dtype_bytes: 2L · 2(N−1)/N · bytes / link_bw (0 for N = 1)."""
    _check(tp, tokens)
    if tp == 1:
        return 0.0
    nbytes = tokens * arch.hidden_size * arch.dtype_bytes
    return 2 * arch.num_layers * 2 * (tp - 1) / tp * nbytes / hw.link_bw(tp)


def prefill_time(
    arch: ModelArch, hw: Hardware, total_tokens: float, tp: int = 1, seq_lens: Sequence[int] | None = None
) -> float:
    """Prefill of a batch of ``total_tokens`` prompt tokens.

    ``seq_lens`` gives the prompts for the quadratic attention term; without it the batch is taken as
    one prompt of ``total_tokens`` (an upper bound).
    """
    _check(tp, total_tokens)
    sq = sum(x * x for x in seq_lens) if seq_lens is not None else total_tokens**2
    attn_width = arch.num_heads * arch.head_dim
    flops = 2 * arch.matmul_params * total_tokens + 2 * arch.num_layers * attn_width * sq
    nbytes = arch.weight_bytes + total_tokens * arch.kv_bytes_per_token
    compute = flops / (tp * hw.flops)
    memory = nbytes / (tp * hw.bandwidth)
    return max(compute, memory) + allreduce_time(arch, hw, total_tokens, tp)


def _decode_terms(arch: ModelArch, hw: Hardware, batch: float, tp: int) -> tuple[float, float, float, float]:
    """(A_c, B_c, A_m, B_m): compute = A_c + B_c·l and memory = A_m + B_m·l for context l."""
    attn_width = arch.num_heads * arch.head_dim
    a_c = 2 * arch.matmul_params * batch / (tp * hw.flops)
    b_c = 4 * arch.num_layers * attn_width * batch / (tp * hw.flops)
    a_m = arch.weight_bytes / (tp * hw.bandwidth)
    b_m = batch * arch.kv_bytes_per_token / (tp * hw.bandwidth)
    return a_c, b_c, a_m, b_m


def decode_time(arch: ModelArch, hw: Hardware, batch: float, mean_context: float, tp: int = 1) -> float:
    """One decode iteration of ``batch`` sequences with mean context ``mean_context``."""
    _check(tp, batch, mean_context)
    a_c, b_c, a_m, b_m = _decode_terms(arch, hw, batch, tp)
    return max(a_c + b_c * mean_context, a_m + b_m * mean_context) + allreduce_time(arch, hw, batch, tp)


def _line_sum(a: float, b: float, lo: int, hi: int) -> float:
    """Σ_{x=lo..hi} (a + b·x)."""
    n = hi - lo + 1
    return n * a + b * (lo + hi) * n / 2 if n > 0 else 0.0


def solo_time(arch: ModelArch, hw: Hardware, prompt_tokens: int, output_tokens: int, tp: int = 1) -> float:
    """One request alone (batch of one, no queueing): its prefill plus :func:`decode_time` of one
    sequence at contexts p+1 .. p+o−1, summed in closed form (compute and memory are both linear in the
    context, so each side of their crossing is an arithmetic series)."""
    _check(tp, prompt_tokens, output_tokens)
    t = prefill_time(arch, hw, prompt_tokens, tp, [prompt_tokens])
    lo, hi = prompt_tokens + 1, prompt_tokens + output_tokens - 1
    if hi < lo:
        return t
    a_c, b_c, a_m, b_m = _decode_terms(arch, hw, 1, tp)
    t += (hi - lo + 1) * allreduce_time(arch, hw, 1, tp)
    if b_c == b_m:  # parallel lines: one is on top throughout
        return t + (_line_sum(a_m, b_m, lo, hi) if a_m >= a_c else _line_sum(a_c, b_c, lo, hi))
    cross = (a_m - a_c) / (b_c - b_m)  # the lines meet here
    if b_c > b_m:  # compute grows faster: memory on top for x <= cross
        split = min(hi, max(lo - 1, int(cross // 1)))
        return t + _line_sum(a_m, b_m, lo, split) + _line_sum(a_c, b_c, split + 1, hi)
    first = max(lo, -int(-cross // 1))  # memory grows faster: memory on top from the crossing on
    return t + _line_sum(a_c, b_c, lo, min(hi, first - 1)) + _line_sum(a_m, b_m, first, hi)


@dataclass(frozen=True)
class RooflinePrefill:
    """Roofline prefill with :class:`~llmfleet.costmodel.aladdin.PrefillModel`'s ``predict``."""

    arch: ModelArch
    hw: Hardware
    tp: int = 1

    def predict(self, total_tokens: float) -> float:
        return prefill_time(self.arch, self.hw, total_tokens, self.tp)


@dataclass(frozen=True)
class RooflineDecode:
    """Roofline decode with :class:`~llmfleet.costmodel.aladdin.DecodeModel`'s interface."""

    arch: ModelArch
    hw: Hardware
    tp: int = 1

    def predict(self, batch: float, mean_context: float) -> float:
        return decode_time(self.arch, self.hw, batch, mean_context, self.tp)

    def context_limit(self, batch: float, t_dec: float) -> float:
        """Largest Σ context (b·l) with decode_time ≤ t_dec; both roofline legs are linear in l."""
        if batch <= 0:
            raise ValueError(f"batch must be > 0, got {batch}")
        a_c, b_c, a_m, b_m = _decode_terms(self.arch, self.hw, batch, self.tp)
        budget = t_dec - allreduce_time(self.arch, self.hw, batch, self.tp)
        if budget < max(a_c, a_m):
            return 0.0
        return batch * min((budget - a_c) / b_c, (budget - a_m) / b_m)


@dataclass(frozen=True)
class RooflineModel:
    """Roofline behind the same interface as ``AladdinModel`` (``.prefill``/``.decode``, ``*_time``)."""

    arch: ModelArch
    hw: Hardware
    tp: int = 1
    source: str = "roofline"

    @property
    def prefill(self) -> RooflinePrefill:
        return RooflinePrefill(self.arch, self.hw, self.tp)

    @property
    def decode(self) -> RooflineDecode:
        return RooflineDecode(self.arch, self.hw, self.tp)

    def prefill_time(self, total_tokens: float) -> float:
        return prefill_time(self.arch, self.hw, total_tokens, self.tp)

    def decode_time(self, batch: float, mean_context: float) -> float:
        return decode_time(self.arch, self.hw, batch, mean_context, self.tp)


def roofline_legs(
    arch: ModelArch, hw: Hardware, tp: int = 1
) -> tuple[tuple[tuple[float, float, float], ...], tuple[tuple[float, float, float], ...]]:
    """The roofline as cost legs (α, β, γ): prefill over (T, Σl²) and decode over (b, Σ context), each
    (compute, memory), the all-reduce on both (``costmodel.iteration_costs.LinearCost``)."""
    _check(tp, 0)
    f, bw = tp * hw.flops, tp * hw.bandwidth
    attn = arch.num_layers * arch.num_heads * arch.head_dim
    ar = allreduce_time(arch, hw, 1, tp)  # per token (prefill) / per sequence (decode)
    prefill = (
        (0.0, 2 * arch.matmul_params / f + ar, 2 * attn / f),
        (arch.weight_bytes / bw, arch.kv_bytes_per_token / bw + ar, 0.0),
    )
    decode = (
        (0.0, 2 * arch.matmul_params / f + ar, 4 * attn / f),
        (arch.weight_bytes / bw, ar, arch.kv_bytes_per_token / bw),
    )
    return prefill, decode
