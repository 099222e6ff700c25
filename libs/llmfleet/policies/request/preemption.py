"""Preemption for priority and fairness: which running request a waiting one that cannot be admitted
(no batch slot, or no KV blocks) may preempt by recompute (its KV freed, its output so far folded into
its prompt, back to waiting; the engine core's KV-shortage path).

* **Priority** (vLLM's ``--scheduling-policy priority``): a waiting request of a higher priority than
  some running request preempts the running request of the lowest priority, the latest arrival among
  equals.
* **Fairness** (per tenant, an API key, within the claimant's priority band): the band's slots (the
  engine's batch room less what higher priorities hold) are shared max-min fairly among the tenants
  with requests in the band, running or waiting (:func:`fair_shares`); a waiting request of a tenant
  that holds fewer slots than its share preempts the latest-arriving running request of the tenant
  furthest above its share. Requests without a tenant ("") never preempt for fairness. With credit
  (``credit_window_s`` > 0, :mod:`~llmfleet.policies.request.slot_credit`), a tenant's standing is its
  share plus its credit: the requests' worth of slots it left unused below its entitled share lately
  (negative: held above it), so a key whose use stays below its share bursts past its instantaneous
  share, from a key whose use stays above its own.

Preemption only when it gains, and a bounded waste:

* priority: a strictly higher priority only (equal priorities never preempt one another);
* fairness: only when the move narrows the gap between the two tenants' excesses (slots held less
  share and credit): the gap ``g`` = victim's excess − claimant's excess becomes ``g − 2``, narrower
  when ``|g − 2| < g``, i.e. ``g > 1`` (compared with a margin for rounding); without credit that is
  ``mine + 1 <= theirs − 1``. The reverse move would widen it, so two tenants never take a slot back
  and forth;
* a request preempted ``max_preemptions`` times (any preemption, KV shortage included) is no longer a
  victim: it runs to its end, so one request's recomputation is bounded by that many re-prefills.

Pure: the engine core asks it before each step (:class:`~llmfleet.engine_core.core.EngineCore`), the
scheduler's late binding asks it whether a saturated engine may still take a request
(:mod:`llmfleet.policies.capacity.preempt_room`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

DEFAULT_MAX_PREEMPTIONS = 2
DEFAULT_CREDIT_WINDOW_S = 10.0
_EPS = 1e-9  # fractional shares and credits must not tip a gap of exactly 1 over by rounding


@dataclass(frozen=True, slots=True)
class Claim:
    """A request as preemption sees it: its id, priority, tenant ("" none), arrival and how often it
    was preempted already."""

    key: str
    priority: int = 0
    tenant: str = ""
    arrival_s: float = 0.0
    preemptions: int = 0


def fair_shares(slots: float, demand: Mapping[str, int]) -> dict[str, float]:
    """Max-min fair shares of ``slots`` among tenants asking ``demand`` slots each (water-filling: a
    tenant asking less than an equal split gets what it asks, the rest is split among the others)."""
    shares: dict[str, float] = {}
    left = float(max(0.0, slots))
    asking = sorted((n, t) for t, n in demand.items() if n > 0)
    for i, (n, t) in enumerate(asking):
        even = left / (len(asking) - i)
        shares[t] = min(float(n), even)
        left -= shares[t]
    return shares


def _latest(claims: Iterable[Claim]) -> Claim | None:
    return max(claims, key=lambda c: (c.arrival_s, c.key), default=None)


@dataclass(frozen=True)
class PreemptionRule:
    """``priority`` / ``fairness``: which of the two preempts; ``max_preemptions``: how often one
    request may be preempted before it is no longer a victim; ``credit_window_s``: the time constant of
    the tenants' fairness credit, their activity window and the leak of their banks (0: none,
    instantaneous shares only)."""

    priority: bool = True
    fairness: bool = True
    max_preemptions: int = DEFAULT_MAX_PREEMPTIONS
    credit_window_s: float = DEFAULT_CREDIT_WINDOW_S

    def __post_init__(self) -> None:
        if self.max_preemptions < 0:
            raise ValueError(f"max_preemptions must be >= 0, got {self.max_preemptions}")
        if self.credit_window_s < 0:
            raise ValueError(f"credit_window_s must be >= 0, got {self.credit_window_s}")

    def preemptible(self, c: Claim) -> bool:
        return c.preemptions < self.max_preemptions

    def victim(
        self,
        claimant: Claim,
        holders: Sequence[Claim],
        slots: int,
        waiting: Sequence[Claim] = (),
        credit: Mapping[str, float] | None = None,
    ) -> Claim | None:
        """The holder (a request holding a slot) that ``claimant`` may preempt; None: none. ``slots``:
        the engine's batch room; ``waiting``: the requests that wait with ``claimant`` (their tenants'
        demand; ``claimant`` counts whether or not it is among them); ``credit``: tenant -> credit in
        slots in ``claimant``'s band (None or absent: 0)."""
        if self.priority:
            got = self.priority_victim(claimant, holders, slots)
            if got is not None:
                return got
        if self.fairness:
            return self.fair_victim(claimant, holders, slots, waiting, credit)
        return None

    def priority_victim(self, claimant: Claim, holders: Sequence[Claim], slots: int) -> Claim | None:
        """The lowest-priority holder below ``claimant``'s priority, the latest arrival among equals;
        None when there is none or when the holders at or above its priority fill ``slots`` already."""
        lower = [h for h in holders if h.priority < claimant.priority and self.preemptible(h)]
        if not lower or sum(1 for h in holders if h.priority >= claimant.priority) >= slots:
            return None
        bottom = min(h.priority for h in lower)
        return _latest(h for h in lower if h.priority == bottom)

    def fair_victim(
        self,
        claimant: Claim,
        holders: Sequence[Claim],
        slots: int,
        waiting: Sequence[Claim] = (),
        credit: Mapping[str, float] | None = None,
    ) -> Claim | None:
        """Within ``claimant``'s priority band: the latest holder of the tenant furthest above its fair
        share plus credit, when ``claimant``'s tenant is below its own and the move narrows the gap
        (module doc)."""
        me = claimant.tenant
        if not me:
            return None
        band = [h for h in holders if h.priority == claimant.priority]
        above = sum(1 for h in holders if h.priority > claimant.priority)
        held = Counter(h.tenant for h in band)
        demand = held.copy()
        demand.update(w.tenant for w in waiting if w.priority == claimant.priority)
        if not any(w.key == claimant.key for w in waiting):
            demand[me] += 1
        shares = fair_shares(slots - above, demand)
        credit = credit or {}

        def excess(t: str) -> float:
            return held.get(t, 0) - shares.get(t, 0.0) - credit.get(t, 0.0)

        mine = excess(me)
        if mine >= 0:
            return None
        over = {t: x for t in held if t and t != me and (x := excess(t)) > 0 and x - mine > 1 + _EPS}
        for t in sorted(over, key=lambda t: (-over[t], t)):  # furthest above first
            got = _latest(h for h in band if h.tenant == t and self.preemptible(h))
            if got is not None:
                return got
        return None

    def rank(
        self,
        c: Claim,
        held: Mapping[tuple[int, str], int],
        credit: Mapping[tuple[int, str], float] | None = None,
    ) -> tuple[int, float, float, str]:
        """The order in which waiting requests claim slots: higher priority first, then the tenant
        holding fewer slots in that band less its credit (``held``: (priority, tenant) -> running
        requests, ``credit`` likewise; neither when fairness is off), then arrival."""
        mine = 0.0
        if self.fairness and c.tenant:
            k = (c.priority, c.tenant)
            mine = held.get(k, 0) - (credit.get(k, 0.0) if credit is not None else 0.0)
        return (-c.priority, mine, c.arrival_s, c.key)


@lru_cache(maxsize=16)
def under_hold_queue(rule: PreemptionRule | None, fair_queue: bool) -> PreemptionRule | None:
    """``rule`` as late binding applies it: fairness among tenants only where the hold queue itself is
    fair (``fairness: vtc``), so that a tenant is not sent past an order that ignores tenants."""
    if rule is None or fair_queue or not rule.fairness:
        return rule
    return replace(rule, fairness=False)
