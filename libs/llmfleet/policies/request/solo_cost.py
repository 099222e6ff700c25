"""The single-request execution time SeaLLM's Eq. 7 profiles: L̂_r, "the profiled execution time of r on
one GPU" — the request alone (batch of one, no queueing): its prefill plus one decode step per further
output token.

:class:`SoloCost` is the type a policy declares it needs (anything with ``solo_time``).
:class:`CostSolo` is the default: ``CostBook.solo_time`` of each model on one GPU of a catalog hardware
type under a cost source (default the default, ``costmodel.sources``), the simulator's own solo time, so
in a simulation on that hardware and source it equals the request's ``solo_s``. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from llmfleet.costmodel.hardware import hardware
from llmfleet.costmodel.iteration_costs import CostBook
from llmfleet.costmodel.models import UnknownModel, model_arch
from llmfleet.costmodel.sources import DEFAULT_COST_SOURCE, check_cost_source


@runtime_checkable
class SoloCost(Protocol):
    """Execution time in seconds of one request of ``model`` run alone: prefill of ``prompt_tokens``,
    then ``output_tokens − 1`` decode steps of a batch of one. Raises ``KeyError`` for an unknown model."""

    def solo_time(self, model: str, prompt_tokens: int, output_tokens: int) -> float: ...


@dataclass
class CostSolo:
    """:class:`SoloCost` from cost ``source`` on one GPU of ``hardware`` (default the A100-80GB, the
    catalog's stand-in for SeaLLM's A800). Unknown models raise ``UnknownModel`` (a KeyError)."""

    hardware: str = "a100-80gb"
    source: str = DEFAULT_COST_SOURCE
    _books: dict[str, CostBook] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        hardware(self.hardware)  # UnknownHardware lists the catalog
        check_cost_source(self.source)

    def solo_time(self, model: str, prompt_tokens: int, output_tokens: int) -> float:
        book = self._books.get(model)
        if book is None:
            arch = model_arch(model)
            book = self._books[model] = CostBook.build(
                hardware(self.hardware), {model: arch}, source=self.source
            )
        return book.solo_time(model, 1, prompt_tokens, output_tokens)


def as_solo_cost(cost: SoloCost | Mapping[str, Any] | None) -> SoloCost:
    """None → :class:`CostSolo` on the A100-80GB under the default cost source; ``{"hardware": NAME,
    "source": COST_SOURCE}`` (either optional) → that; an object with ``solo_time`` as is."""
    if cost is None:
        return CostSolo()
    if isinstance(cost, Mapping):
        if set(cost) - {"hardware", "source"}:
            raise ValueError(f"a cost mapping takes only 'hardware' and 'source', got keys {sorted(cost)}")
        return CostSolo(str(cost.get("hardware", "a100-80gb")), str(cost.get("source", DEFAULT_COST_SOURCE)))
    if not callable(getattr(cost, "solo_time", None)):
        raise ValueError(
            f"cost must have solo_time(model, prompt_tokens, output_tokens), got {type(cost).__name__}"
        )
    return cost


__all__ = ["CostSolo", "SoloCost", "UnknownModel", "as_solo_cost"]
