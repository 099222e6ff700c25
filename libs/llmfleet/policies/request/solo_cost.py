"""The single-request execution time SeaLLM's Eq. 7 profiles: L̂_r, "the profiled execution time of r on
one GPU" — the request alone (batch of one, no queueing): its prefill plus one decode step per further
output token.

:class:`SoloCost` is the type a policy declares it needs (anything with ``solo_time``).
:class:`RooflineSolo` is the default: the catalog roofline (``llmfleet.costmodel.roofline``) of each model
on one GPU of a catalog hardware type, the same formulas the simulator's roofline cost uses, so in the
simulator it equals the request's ``solo_s``. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from llmfleet.costmodel.hardware import Hardware, hardware
from llmfleet.costmodel.models import ModelArch, UnknownModel, model_arch
from llmfleet.costmodel.roofline import prefill_time


@runtime_checkable
class SoloCost(Protocol):
    """Execution time in seconds of one request of ``model`` run alone: prefill of ``prompt_tokens``,
    then ``output_tokens − 1`` decode steps of a batch of one. Raises ``KeyError`` for an unknown model."""

    def solo_time(self, model: str, prompt_tokens: int, output_tokens: int) -> float: ...


def _line_sum(a: float, b: float, lo: int, hi: int) -> float:
    """Σ_{x=lo..hi} (a + b·x)."""
    n = hi - lo + 1
    return n * a + b * (lo + hi) * n / 2 if n > 0 else 0.0


def roofline_solo_time(arch: ModelArch, hw: Hardware, prompt_tokens: int, output_tokens: int) -> float:
    """Roofline solo time on one GPU: prefill(p) + Σ_{x=p+1..p+o−1} max(compute(x), memory(x)), where one
    sequence's decode at context x costs compute 2·P_mm/F + 4·L·H·d·x/F and memory W/B + kv·x/B (both
    linear in x, so the sum is closed-form on each side of their crossing)."""
    if prompt_tokens < 0 or output_tokens < 0:
        raise ValueError(f"token counts must be >= 0, got {prompt_tokens}, {output_tokens}")
    t = prefill_time(arch, hw, prompt_tokens, 1, [prompt_tokens])
    lo, hi = prompt_tokens + 1, prompt_tokens + output_tokens - 1
    if hi < lo:
        return t
    attn = arch.num_layers * arch.num_heads * arch.head_dim
    a_c, b_c = 2 * arch.matmul_params / hw.flops, 4 * attn / hw.flops
    a_m, b_m = arch.weight_bytes / hw.bandwidth, arch.kv_bytes_per_token / hw.bandwidth
    # memory is on top while a_m + b_m x >= a_c + b_c x; find the last integer x where that holds
    if b_c == b_m:
        split = hi if a_m >= a_c else lo - 1
    else:
        cross = (a_m - a_c) / (b_c - b_m)  # the lines meet here
        if b_c > b_m:  # compute grows faster: memory on top for x <= cross
            split = min(hi, max(lo - 1, int(cross // 1)))
        else:  # memory grows faster: memory on top for x >= cross
            first = max(lo, -int(-cross // 1))
            return t + _line_sum(a_c, b_c, lo, min(hi, first - 1)) + _line_sum(a_m, b_m, max(lo, first), hi)
    return t + _line_sum(a_m, b_m, lo, split) + _line_sum(a_c, b_c, split + 1, hi)


@dataclass
class RooflineSolo:
    """:class:`SoloCost` from the catalog roofline on one GPU of ``hardware`` (default the A100-80GB,
    the catalog's stand-in for SeaLLM's A800). Unknown models raise ``UnknownModel`` (a KeyError)."""

    hardware: str = "a100-80gb"
    _hw: Hardware = field(init=False, repr=False)
    _archs: dict[str, ModelArch] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._hw = hardware(self.hardware)

    def solo_time(self, model: str, prompt_tokens: int, output_tokens: int) -> float:
        arch = self._archs.get(model)
        if arch is None:
            arch = self._archs[model] = model_arch(model)
        return roofline_solo_time(arch, self._hw, prompt_tokens, output_tokens)


def as_solo_cost(cost: SoloCost | Mapping[str, Any] | None) -> SoloCost:
    """None → :class:`RooflineSolo` on the A100-80GB; ``{"hardware": NAME}`` → on that hardware; an object
    with ``solo_time`` as is."""
    if cost is None:
        return RooflineSolo()
    if isinstance(cost, Mapping):
        if set(cost) - {"hardware"}:
            raise ValueError(f"a cost mapping takes only 'hardware', got keys {sorted(cost)}")
        return RooflineSolo(str(cost.get("hardware", "a100-80gb")))
    if not callable(getattr(cost, "solo_time", None)):
        raise ValueError(
            f"cost must have solo_time(model, prompt_tokens, output_tokens), got {type(cost).__name__}"
        )
    return cost


__all__ = ["RooflineSolo", "SoloCost", "UnknownModel", "as_solo_cost", "roofline_solo_time"]
