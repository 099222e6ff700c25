"""A cost source as a policy's latency model: the iteration costs the simulator and the emulated
engines charge, behind the interface Aladdin's dispatch and worker sizing read.

``latency_model(arch, hw, tp, source)`` answers ``.prefill.predict(tokens)`` (one prompt),
``.decode.predict(batch, mean_context)``, ``.decode.context_limit(batch, T_dec)`` (the largest Σ
context whose decode iteration meets T_dec) and ``prefill_time``/``decode_time``, like
``AladdinModel`` and ``RooflineModel``. ``decode_iteration_time(arch, hw, source)`` is Aladdin's
``IterationTime`` (n GPUs, batch, mean context → seconds) for Eq. 6. ``cost_record(arch, hw, tp, source)``
fits the Aladdin and SCLS forms to the source's points (a ``ProfileRecord``, as the profiler writes). All
default to the default cost source (``costmodel.sources``), so a policy prices work as the engines it
dispatches to are charged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from llmfleet.costmodel.hardware import Hardware
from llmfleet.costmodel.iteration_costs import LinearCost, cost_of
from llmfleet.costmodel.models import ModelArch
from llmfleet.costmodel.serialize import ProfileRecord, forms_record
from llmfleet.costmodel.sources import DEFAULT_COST_SOURCE


@dataclass(frozen=True)
class CostPrefill:
    cost: LinearCost

    def predict(self, total_tokens: float) -> float:
        return self.cost.prefill(total_tokens)


@dataclass(frozen=True)
class CostDecode:
    cost: LinearCost

    def predict(self, batch: float, mean_context: float) -> float:
        return self.cost.decode(batch, batch * mean_context)

    def context_limit(self, batch: float, t_dec: float) -> float:
        """Largest Σ context S with decode(batch, S) ≤ t_dec: every leg α + β·b + γ·S must be within
        it (0 when even an empty context is slower; inf when no leg grows with context)."""
        if batch <= 0:
            raise ValueError(f"batch must be > 0, got {batch}")
        limit = math.inf
        for a, b, g in self.cost.decode_legs:
            slack = t_dec - a - b * batch
            if slack < 0:
                return 0.0
            if g > 0:
                limit = min(limit, slack / g)
        return limit


@dataclass(frozen=True)
class CostLatencyModel:
    """One model at one TP degree on one hardware, priced by a cost source."""

    cost: LinearCost

    @property
    def source(self) -> str:
        return self.cost.source

    @property
    def prefill(self) -> CostPrefill:
        return CostPrefill(self.cost)

    @property
    def decode(self) -> CostDecode:
        return CostDecode(self.cost)

    def prefill_time(self, total_tokens: float) -> float:
        return self.cost.prefill(total_tokens)

    def decode_time(self, batch: float, mean_context: float) -> float:
        return self.cost.decode(batch, batch * mean_context)


@cache
def _cost(source: str, arch: ModelArch, hw: Hardware, tp: int) -> LinearCost:
    return cost_of(source, arch, hw, tp)


def latency_model(
    arch: ModelArch, hw: Hardware, tp: int = 1, source: str = DEFAULT_COST_SOURCE
) -> CostLatencyModel:
    """The latency model of ``arch`` at ``tp`` on ``hw`` from cost ``source``."""
    return CostLatencyModel(_cost(source, arch, hw, tp))


def decode_iteration_time(
    arch: ModelArch, hw: Hardware, source: str = DEFAULT_COST_SOURCE
) -> Callable[[int, float, float], float]:
    """(n GPUs, batch, mean context tokens) → one decode iteration's seconds under ``source``."""
    return lambda n, batch, ctx: _cost(source, arch, hw, n).decode(batch, batch * ctx)


def cost_record(
    arch: ModelArch, hw: Hardware, tp: int = 1, source: str = DEFAULT_COST_SOURCE, date: str | None = None
) -> ProfileRecord:
    """``roofline_record``'s fit on the points of cost ``source`` (a batch of b prompts of l tokens is a
    prefill of b·l tokens with Σl² = b·l²): the Aladdin and SCLS forms of the iteration costs the
    simulator and the emulated engines charge. The record's source and engine are the source's name."""
    lm = _cost(source, arch, hw, tp)
    return forms_record(
        arch,
        hw,
        tp,
        lambda b, ln: lm.prefill(b * ln, b * ln * ln),
        lambda b, ln: lm.decode(b, b * ln),
        source,
        source,
        date,
    )
