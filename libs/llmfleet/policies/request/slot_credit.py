"""Fairness credit: how far below (or above) its entitled share of an engine's slots each tenant has held
lately, so that a tenant whose use stays below its share may burst past its instantaneous share (a
per-tenant bucket of slot-seconds, refilled at its share while it asks for slots).

A tenant's entitled share in a priority band is an equal split of the band's slots (the engine's batch
room less what higher priorities hold) among the tenants that ask for slots there (running or waiting);
its credit is the time average of (entitled share − slots held) over the moments it asks, with time
constant ``window_s`` (an exponentially weighted average; a tenant that asks for nothing keeps its
credit, so an idle tenant banks nothing). A light key holding one slot of an entitled two earns one
slot of credit; a heavy key holding three owes one; two keys that saturate an engine together stay
level at zero. :class:`~llmfleet.policies.request.preemption.PreemptionRule` adds the credit to the
max-min fair share when it names a victim.

Stateful, but pure of I/O and clocks: the engine core observes its running and waiting requests before
each step, the scheduler's late binding the requests it placed on each engine (``llmfleet_scheduler.
capacity``), the simulator's holds those of each instance (``llmfleet.sim.holds``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from llmfleet.policies.request.preemption import Claim, PreemptionRule

_NEUTRAL = 1e-3  # a credit this close to 0 is dropped (a tenant absent from the table has none)


def entitled_gaps(
    holders: Iterable[Claim], waiting: Iterable[Claim], slots: int
) -> dict[tuple[int, str], float]:
    """Per (priority, tenant) asking for slots: its entitled share less the slots it holds (module doc)."""
    held: Counter[tuple[int, str]] = Counter()
    asking: set[tuple[int, str]] = set()
    for h in holders:
        held[(h.priority, h.tenant)] += 1
        asking.add((h.priority, h.tenant))
    asking.update((w.priority, w.tenant) for w in waiting)
    by_band: dict[int, list[str]] = {}
    for priority, tenant in asking:
        by_band.setdefault(priority, []).append(tenant)
    gaps: dict[tuple[int, str], float] = {}
    above = 0
    for priority in sorted(by_band, reverse=True):
        tenants = by_band[priority]
        room = max(0, slots - above)
        named = [t for t in tenants if t]
        for t in named:
            gaps[(priority, t)] = room / len(named) - held[(priority, t)]
        above += sum(held[(priority, t)] for t in tenants)
    return gaps


@dataclass
class SlotCredit:
    """One engine's tenants' credit, in slots (positive: held less than entitled lately)."""

    window_s: float
    _credit: dict[tuple[int, str], float] = field(default_factory=dict, init=False)
    _gaps: dict[tuple[int, str], float] = field(
        default_factory=dict, init=False
    )  # since the last observation
    _at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")

    def observe(self, now: float, holders: Iterable[Claim], waiting: Iterable[Claim], slots: int) -> None:
        """The engine at ``now`` holds ``holders`` (running) with ``waiting`` asking for slots; the
        previous observation's gaps held until ``now``."""
        if self._at is not None and now > self._at:
            w = 1.0 - math.exp(-(now - self._at) / self.window_s)
            for k, gap in self._gaps.items():
                c = self._credit.get(k, 0.0)
                c += w * (gap - c)
                if abs(c) < _NEUTRAL:
                    self._credit.pop(k, None)
                else:
                    self._credit[k] = c
        if self._at is None or now >= self._at:
            self._at = now
            self._gaps = entitled_gaps(holders, waiting, slots)

    @property
    def table(self) -> Mapping[tuple[int, str], float]:
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
