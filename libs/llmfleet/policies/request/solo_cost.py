"""The single-request execution time SeaLLM's Eq. 7 profiles: L̂_r, "the profiled execution time of r on
one GPU" — the request alone (batch of one, no queueing): its prefill plus one decode step per further
output token.

:class:`SoloCost` is the type a policy declares it needs (anything with ``solo_time``).
:class:`RooflineSolo` is the default: ``llmfleet.costmodel.roofline.solo_time`` of each model on one GPU
of a catalog hardware type, the same formulas the simulator's roofline cost uses, so in the
simulator it equals the request's ``solo_s``. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from llmfleet.costmodel.hardware import Hardware, hardware
from llmfleet.costmodel.models import ModelArch, UnknownModel, model_arch
from llmfleet.costmodel.roofline import solo_time


@runtime_checkable
class SoloCost(Protocol):
    """Execution time in seconds of one request of ``model`` run alone: prefill of ``prompt_tokens``,
    then ``output_tokens − 1`` decode steps of a batch of one. Raises ``KeyError`` for an unknown model."""

    def solo_time(self, model: str, prompt_tokens: int, output_tokens: int) -> float: ...


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
        return solo_time(arch, self._hw, prompt_tokens, output_tokens)


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


__all__ = ["RooflineSolo", "SoloCost", "UnknownModel", "as_solo_cost"]
