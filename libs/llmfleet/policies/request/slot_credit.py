"""Fairness credit: how far below (or above) its entitled share of an engine's slots each tenant has held
lately, so that a tenant whose use stays below its share may burst past its instantaneous share (a
per-tenant bucket of slot-seconds, refilled at its share).

A tenant is *active* on an engine while it asked for slots there (a request running or waiting) within
the last ``window_s`` seconds. A tenant's entitled share in a priority band is an equal split of the
band's slots (the engine's batch room less what higher priorities hold) among the band's active
tenants, whether or not they hold anything now. Its credit is the time average of (entitled share −
slots held) while it is active, with time constant ``window_s`` (an exponentially weighted average).

- A light key that sends a request now and then, holding one slot or none of an entitled two, earns
  credit up to two slots; the heavy key filling the rest owes as much.
- A tenant idle for longer than the window leaves the table: it banks nothing, and a newcomer starts
  at zero.
- Two keys that saturate an engine together stay level at zero.

:class:`~llmfleet.policies.request.preemption.PreemptionRule` adds the credit to the max-min fair share
when it names a victim.

Stateful, but pure of I/O and clocks: the engine core observes its running and waiting requests before
each step, the scheduler's late binding the requests it placed on each engine (``llmfleet_scheduler.
capacity``), the simulator's holds those of each instance (``llmfleet.sim.holds``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from llmfleet.policies.request.preemption import Claim, PreemptionRule

_NEUTRAL = 1e-3  # a credit this close to 0 is dropped (a tenant absent from the table has none)


Pair = tuple[int, str]  # (priority, tenant)


def held_pairs(claims: Iterable[Claim]) -> Counter[Pair]:
    """Slots held per (priority, tenant) by ``claims``."""
    return Counter((c.priority, c.tenant) for c in claims)


def entitled_gaps(held: Mapping[Pair, int], active: Iterable[Pair], slots: int) -> dict[Pair, float]:
    """Per active (priority, tenant): its entitled share less the slots it holds (module doc)."""
    by_band: dict[int, list[str]] = {}
    for priority, tenant in active:
        if tenant:
            by_band.setdefault(priority, []).append(tenant)
    gaps: dict[Pair, float] = {}
    for priority, tenants in by_band.items():
        room = max(0, slots - sum(n for (p, _), n in held.items() if p > priority))
        for t in tenants:
            gaps[(priority, t)] = room / len(tenants) - held.get((priority, t), 0)
    return gaps


@dataclass
class SlotCredit:
    """One engine's tenants' credit, in slots (positive: held less than entitled lately)."""

    window_s: float
    _credit: dict[Pair, float] = field(default_factory=dict, init=False)
    _gaps: dict[Pair, float] = field(default_factory=dict, init=False)  # until the next observation
    _asked: dict[Pair, float] = field(default_factory=dict, init=False)  # when it last asked
    _at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")

    def observe(self, now: float, held: Mapping[Pair, int], waiting: Iterable[Pair], slots: int) -> None:
        """The engine at ``now`` holds ``held`` slots per (priority, tenant), with ``waiting`` asking
        for more; the previous observation's gaps held until ``now``. An observation older than the
        last is ignored."""
        if self._at is not None:
            if now < self._at:
                return
            w = 1.0 - math.exp(-(now - self._at) / self.window_s)
            for k, gap in self._gaps.items():
                c = self._credit.get(k, 0.0)
                c += w * (gap - c)
                if abs(c) < _NEUTRAL:
                    self._credit.pop(k, None)
                else:
                    self._credit[k] = c
        self._at = now
        for k in (*held, *waiting):
            if k[1]:
                self._asked[k] = now
        for k in [k for k, t in self._asked.items() if now - t > self.window_s]:
            del self._asked[k]
            self._credit.pop(k, None)
        self._gaps = entitled_gaps(held, self._asked, slots)

    @property
    def table(self) -> Mapping[Pair, float]:
        """(priority, tenant) -> credit in slots (a pair not named: 0)."""
        return MappingProxyType(self._credit)

    def of(self, priority: int) -> dict[str, float]:
        """Tenant -> credit in slots within ``priority``'s band (a tenant not named: 0)."""
        return {t: c for (p, t), c in self._credit.items() if p == priority}

    def __len__(self) -> int:
        return len(self._credit)


def credit_for(rule: PreemptionRule | None) -> SlotCredit | None:
    """A tracker for ``rule``'s fairness credit; None when the rule has none (no rule, fairness off, or
    ``credit_window_s`` 0: instantaneous shares only)."""
    if rule is None or not rule.fairness or rule.credit_window_s <= 0:
        return None
    return SlotCredit(rule.credit_window_s)


class EngineCredits:
    """The scheduler's (and the simulator's) view of each engine's credit: one tracker per engine, fed
    the claims placed there whenever the engine is weighed (:meth:`band`); ``forget`` drops an engine
    that left."""

    def __init__(self) -> None:
        self._by_engine: dict[str, SlotCredit] = {}

    def band(
        self,
        engine: str,
        rule: PreemptionRule | None,
        now: float,
        present: Sequence[Claim],
        slots: int,
        priority: int,
    ) -> dict[str, float] | None:
        """``engine``'s credit in ``priority``'s band after observing ``present`` at ``now`` (every
        claim counts as holding a slot, as late binding counts them); None: ``rule`` has no credit."""
        credit = self._by_engine.get(engine)
        if credit is None:
            credit = credit_for(rule)
            if credit is None:
                return None
            self._by_engine[engine] = credit
        credit.observe(now, held_pairs(present), (), slots)
        return credit.of(priority)

    def forget(self, engine: str) -> None:
        self._by_engine.pop(engine, None)
