"""Iteration latency: one latency model per (model, TP degree) on one hardware type.

What the simulator, the emulated engine and the migration coordinator price iterations with
(``llmfleet.sim.cost`` re-exports it for the simulator).

Defaults are the roofline (``costmodel.roofline``); a fitted :class:`~llmfleet.costmodel.ProfileRecord`
(Aladdin forms, e.g. from the profiler's Characterize) replaces it for its model. Both are compiled to
the same piecewise-linear form so an iteration costs a few float operations:

- prefill of prompts l_i (T = Σ l_i, Q = Σ l_i²):  max_legs(α + β·T + γ·Q)
- decode of b sequences with Σ context S:          max_legs(α + β·b + γ·S)

Aladdin (one leg each): t_pre = k1·T + c1 and t_d = (k2·l_ave + c2)·b + c3 = c3 + c2·b + k2·S.
Roofline (compute and memory legs, the all-reduce added to both), from ``costmodel.roofline``:
prefill compute 2·P_mm·T + 2·L·H·d·Q FLOPs, memory W + T·kv bytes; decode compute 2·P_mm·b + 4·L·H·d·S,
memory W + S·kv. A mixed batch is one forward: prefill + decode minus the fixed cost they share
(min of the two largest intercepts: the per-iteration overhead, or the weight read); a static batch
t_pre(n·max l) then
t_d(n, n·(max l + i)) per step (padded rows compute too).

Vidur (``costmodel.vidur``, ``cost_source="vidur"``): measured A100/H100 per-layer operator times and
all-reduces (Microsoft Vidur's profiling data) as convex piecewise-linear legs in the tokens of the
iteration, plus a fixed framework overhead and the lm_head, with the roofline's attention terms on γ;
hardware without measurements falls back to the roofline (logged).

Calibrated (``costmodel.calibrated``, ``cost_source="calibrated"``, the default of
``costmodel.sources``): the Vidur legs with the fitted per-iteration overhead a + c·b per TP instead of
the fixed 2 ms; the roofline scaled by fitted factors where nothing is measured.

A request's solo execution time (SeaLLM's "execution time", the basis of normalized latency and of the
5× SLO) is t_pre(l_in) + Σ_{i=1}^{l_out−1} t_d(1, l_in + i), summed in closed form per leg when one leg
dominates the whole range, else term by term.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from llmfleet.costmodel.calibrated import calibrated_legs
from llmfleet.costmodel.hardware import Hardware
from llmfleet.costmodel.models import ModelArch
from llmfleet.costmodel.roofline import roofline_legs
from llmfleet.costmodel.serialize import ProfileRecord
from llmfleet.costmodel.sources import CALIBRATED, COST_SOURCES, DEFAULT_COST_SOURCE, VIDUR, check_cost_source
from llmfleet.costmodel.vidur import FRAMEWORK_OVERHEAD_S, VidurDataError, vidur_legs

Leg = tuple[float, float, float]  # (α, β, γ)
__all__ = [
    "COST_SOURCES",
    "DEFAULT_COST_SOURCE",
    "CostBook",
    "Leg",
    "LinearCost",
    "calibrated_cost",
    "cost_of",
    "fitted_cost",
    "roofline_cost",
    "vidur_cost",
]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinearCost:
    """Compiled latency of one model at one TP degree (see the module docstring)."""

    prefill_legs: tuple[Leg, ...]
    decode_legs: tuple[Leg, ...]
    source: str
    shared_fixed: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.prefill_legs or not self.decode_legs:
            raise ValueError(f"a latency model needs at least one prefill and one decode leg ({self.source})")
        # the fixed cost a mixed iteration pays once, not twice: min of the two phases' largest α
        shared = min(max(a for a, _, _ in self.prefill_legs), max(a for a, _, _ in self.decode_legs))
        object.__setattr__(self, "shared_fixed", shared)

    # (explicit loops rather than max(generator): these run once per simulated iteration)
    def prefill(self, tokens: float, sq_tokens: float | None = None) -> float:
        """Prefill of ``tokens`` prompt tokens; ``sq_tokens`` = Σ l_i² (default: one prompt, T²)."""
        q = tokens * tokens if sq_tokens is None else sq_tokens
        best = -math.inf
        for a, b, g in self.prefill_legs:
            v = a + b * tokens + g * q
            if v > best:
                best = v
        return best

    def decode(self, batch: float, context_sum: float) -> float:
        """One decode iteration of ``batch`` sequences holding ``context_sum`` tokens in total."""
        best = -math.inf
        for a, b, g in self.decode_legs:
            v = a + b * batch + g * context_sum
            if v > best:
                best = v
        return best

    def iteration(self, prefill_tokens: int, prefill_sq: int, decodes: int, context_sum: int) -> float:
        """One continuous-batching iteration: prefill part + decode part (either may be empty)."""
        t = 0.0
        if prefill_tokens:
            t += self.prefill(prefill_tokens, prefill_sq)
        if decodes:
            t += self.decode(decodes, context_sum)
            if prefill_tokens:
                t -= self.shared_fixed
        return t

    def decode_steps(self, batch: int, context_sum: int, growth: int, steps: int) -> np.ndarray:
        """Durations of ``steps`` decode iterations whose Σ context starts at ``context_sum`` and grows by
        ``growth`` each step (vectorised; the same float operations as :meth:`decode`)."""
        out = np.empty(max(0, steps))
        self.decode_steps_into(out, batch, context_sum, growth)
        return out

    def decode_steps_into(self, out: np.ndarray, batch: int, context_sum: int, growth: int) -> None:
        """:meth:`decode_steps` for ``len(out)`` steps, written into ``out`` (float64)."""
        steps = len(out)
        if steps == 0:
            return
        # Σ context per step, exact in float64 (integers below 2**53)
        ctx = (
            np.arange(context_sum, context_sum + growth * steps, growth, dtype=np.float64)
            if growth
            else (np.full(steps, float(context_sum)))
        )
        first = True
        for a, b, g in self.decode_legs:
            fixed = a + b * batch  # then + g·S: the same two float additions as decode()
            if first:
                np.multiply(ctx, g, out=out)
                out += fixed
                first = False
            else:
                leg = ctx * g
                leg += fixed
                np.maximum(out, leg, out=out)

    def prefill_time(self, total_tokens: float) -> float:
        return self.prefill(total_tokens)

    def decode_time(self, batch: float, mean_context: float) -> float:
        return self.decode(batch, batch * mean_context)


def roofline_cost(arch: ModelArch, hw: Hardware, tp: int = 1) -> LinearCost:
    if tp < 1:
        raise ValueError(f"tensor-parallel degree must be ≥ 1, got {tp}")
    prefill, decode = roofline_legs(arch, hw, tp)
    return LinearCost(prefill, decode, "roofline")


def vidur_cost(
    arch: ModelArch, hw: Hardware, tp: int = 1, overhead_s: float = FRAMEWORK_OVERHEAD_S
) -> LinearCost:
    """Measured-operator cost (``costmodel.vidur``), source ``vidur:<gpu>`` (``vidur:<gpu>:derived`` for
    a layer shape that was not profiled); the roofline, with the reason logged, where ``hw`` or this TP
    degree has no measurements."""
    try:
        legs = vidur_legs(arch, hw, tp, overhead_s)
    except VidurDataError as e:
        log.warning("vidur cost for %s at TP %d on %s: %s; using the roofline", arch.name, tp, hw.name, e)
        return roofline_cost(arch, hw, tp)
    source = f"vidur:{legs.gpu}" + (":derived" if legs.provenance == "derived" else "")
    return LinearCost(legs.prefill, legs.decode, source)


def calibrated_cost(arch: ModelArch, hw: Hardware, tp: int = 1) -> LinearCost:
    """Measured operators plus the fitted per-iteration overhead (``costmodel.calibrated``), source
    ``calibrated:<gpu>[:derived]``, or ``calibrated:scaled-roofline`` where nothing is measured."""
    prefill, decode, source = calibrated_legs(arch, hw, tp)
    return LinearCost(prefill, decode, source)


def cost_of(source: str, arch: ModelArch, hw: Hardware, tp: int = 1) -> LinearCost:
    """The latency model of ``arch`` at ``tp`` on ``hw`` from the named cost source
    (``costmodel.sources``)."""
    check_cost_source(source)
    if source == CALIBRATED:
        return calibrated_cost(arch, hw, tp)
    if source == VIDUR:
        return vidur_cost(arch, hw, tp)
    return roofline_cost(arch, hw, tp)


def fitted_cost(rec: ProfileRecord) -> LinearCost:
    p, d = rec.aladdin.prefill, rec.aladdin.decode
    return LinearCost(((p.c1, p.k1, 0.0),), ((d.c3, d.c2, d.k2),), f"fitted:{rec.hardware}:{rec.engine}")


@dataclass
class CostBook:
    """Latency per (model, tp), compiled lazily: a fitted record at its TP degree, else the cost
    ``source`` (``costmodel.sources``: "calibrated", the default, "vidur" or "roofline")."""

    hw: Hardware
    archs: Mapping[str, ModelArch]
    records: Mapping[str, ProfileRecord] = field(default_factory=dict)
    source: str = DEFAULT_COST_SOURCE
    _cache: dict[tuple[str, int], LinearCost] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls,
        hw: Hardware,
        archs: Mapping[str, ModelArch],
        records: Iterable[ProfileRecord] = (),
        source: str = DEFAULT_COST_SOURCE,
    ) -> CostBook:
        check_cost_source(source)
        by_model = {r.model: r for r in records}
        unknown = sorted(set(by_model) - set(archs))
        if unknown:
            raise ValueError(
                f"profile records for models not in the simulation: {unknown}; known: {sorted(archs)}"
            )
        return cls(hw, dict(archs), by_model, source)

    def model(self, name: str, tp: int = 1) -> LinearCost:
        key = (name, tp)
        lm = self._cache.get(key)
        if lm is None:
            rec = self.records.get(name)
            if rec is not None and rec.tp == tp:
                lm = fitted_cost(rec)
            else:
                try:
                    arch = self.archs[name]
                except KeyError:
                    raise ValueError(
                        f"no architecture for model {name!r}; known: {sorted(self.archs)}"
                    ) from None
                lm = cost_of(self.source, arch, self.hw, tp)
            self._cache[key] = lm
        return lm

    def pin(self, name: str, tp: int, cost: LinearCost) -> None:
        """Use ``cost`` for ``name`` at ``tp`` instead of compiling one (a cost given by hand)."""
        self._cache[(name, tp)] = cost

    def sources(self) -> dict[str, str]:
        return {f"{m}@tp{tp}": lm.source for (m, tp), lm in sorted(self._cache.items())}

    def solo_time(self, model: str, tp: int, prompt_tokens: int, output_tokens: int) -> float:
        """Execution time of the request alone on the instance (no queueing, batch of one)."""
        lm = self.model(model, tp)
        t = lm.prefill(prompt_tokens)
        n = output_tokens - 1
        if n <= 0:
            return t
        lo, hi = prompt_tokens + 1, prompt_tokens + n
        legs = lm.decode_legs
        top_lo = _top_leg(legs, lo)
        if top_lo == _top_leg(legs, hi):  # one leg on top at both ends is on top throughout (linear)
            a, b, g = legs[top_lo]
            return t + n * (a + b) + g * (lo + hi) * n / 2
        return t + sum(lm.decode(1, x) for x in range(lo, hi + 1))


def _top_leg(legs: tuple[Leg, ...], x: int) -> int:
    """Index of the largest decode leg for one sequence of context ``x`` (the first on ties)."""
    best, top = -math.inf, 0
    for i, (a, b, g) in enumerate(legs):
        v = a + b + g * x
        if v > best:
            best, top = v, i
    return top
