"""Fairness credit: how many requests' worth of slots each tenant may run past its instantaneous share of
an engine's slots, having held less than its entitled share lately (negative: more), so that a tenant
whose use stays below its share may burst past it.

A tenant is *active* on an engine while it asked for slots there (a request running or waiting) within
the last ``window_s`` seconds. A tenant's entitled share in a priority band is an equal split of the
band's slots (the engine's batch room less what higher priorities hold) among the band's active
tenants, whether or not they hold anything now.

- Its *bank* is the slot-seconds it was entitled to and did not hold (entitled share − slots held,
  integrated while it is active), leaking with time constant ``window_s``: what it left unused in
  the last window or so.
- Its *credit* is the bank in requests: the bank over the time a request holds a slot on this engine
  (Little's law over the window: slot-seconds held ÷ requests that gave a slot up, so a young
  tracker errs long; at most ``window_s``, and ``window_s`` until a request has been seen to end).
  A key that banked 2 slot-seconds where requests hold a slot for 0.5 s may run 4 requests past its
  share, once; running them spends the bank at the rate it holds slots past its share.

So:

- a light key that sends a request now and then, holding one slot or none of an entitled two, earns
  credit at the rate of its unused share, in requests per request duration; the heavy key filling the
  rest owes as much;
- a tenant idle for longer than the window leaves the table: it banks nothing, and a newcomer starts
  at zero (as VTC lifts a newcomer's counter to the active minimum);
- two keys that saturate an engine together stay level near zero.

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
    """One engine's tenants' credit, in requests' worth of slots (positive: held less than entitled
    lately)."""

    window_s: float
    _bank: dict[Pair, float] = field(default_factory=dict, init=False)  # slot-seconds owed, per pair
    _credit: dict[Pair, float] = field(default_factory=dict, init=False)  # the bank in requests
    _gaps: dict[Pair, float] = field(default_factory=dict, init=False)  # until the next observation
    _asked: dict[Pair, float] = field(default_factory=dict, init=False)  # when it last asked
    _busy: int = field(default=0, init=False)  # slots held until the next observation
    _held_s: float = field(default=0.0, init=False)  # slot-seconds held, leaking like the banks
    _ends: float = field(default=0.0, init=False)  # requests that gave a slot up, leaking likewise
    _at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")

    def observe(
        self, now: float, held: Mapping[Pair, int], waiting: Iterable[Pair], slots: int, started: int
    ) -> None:
        """The engine at ``now`` holds ``held`` slots per (priority, tenant), with ``waiting`` asking
        for more, and ``started`` requests took a slot since the last observation; the previous
        observation's gaps held until ``now``. An observation older than the last is ignored."""
        busy = sum(held.values())
        if self._at is not None:  # (the first observation has no interval and no count to start from)
            if now < self._at:
                return
            keep = math.exp(-(now - self._at) / self.window_s)
            gain = self.window_s * (1.0 - keep)  # the leaky integral of 1 over the interval
            bank = self._bank
            for k, gap in self._gaps.items():
                bank[k] = bank.get(k, 0.0) * keep + gap * gain
            self._held_s = self._held_s * keep + self._busy * gain
            self._ends = self._ends * keep + max(0, self._busy + started - busy)  # started, not held: ended
        self._at = now
        self._busy = busy
        for k in (*held, *waiting):
            if k[1]:
                self._asked[k] = now
        for k in [k for k, t in self._asked.items() if now - t > self.window_s]:
            del self._asked[k]
            self._bank.pop(k, None)
        self._gaps = entitled_gaps(held, self._asked, slots)
        hold_s = self.hold_s
        self._credit = {k: c for k, b in self._bank.items() if abs(c := b / hold_s) >= _NEUTRAL}

    @property
    def hold_s(self) -> float:
        """How long a request holds a slot here, lately (at most, and until measured, ``window_s``)."""
        if self._ends <= 0 or self._held_s <= 0:
            return self.window_s
        return min(self.window_s, self._held_s / self._ends)

    @property
    def banks(self) -> Mapping[Pair, float]:
        """(priority, tenant) -> slot-seconds owed (a pair not named: 0)."""
        return MappingProxyType(self._bank)

    @property
    def table(self) -> Mapping[Pair, float]:
        """(priority, tenant) -> credit in requests (a pair not named: 0)."""
        return MappingProxyType(self._credit)

    def of(self, priority: int) -> dict[str, float]:
        """Tenant -> credit in requests within ``priority``'s band (a tenant not named: 0)."""
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
        self._present: dict[str, set[str]] = {}  # the request keys each engine held when last weighed

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
        claim counts as holding a slot, as late binding counts them, and one not present at the last
        weighing took its slot since); None: ``rule`` has no credit."""
        credit = self._by_engine.get(engine)
        if credit is None:
            credit = credit_for(rule)
            if credit is None:
                return None
            self._by_engine[engine] = credit
        keys = {c.key for c in present}
        before = self._present.get(engine)
        self._present[engine] = keys
        credit.observe(now, held_pairs(present), (), slots, len(keys - before) if before is not None else 0)
        return credit.of(priority)

    def forget(self, engine: str) -> None:
        self._by_engine.pop(engine, None)
        self._present.pop(engine, None)
