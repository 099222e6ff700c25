"""Late binding with preemption: a saturated engine (:class:`~llmfleet.policies.capacity.Saturation`)
still takes a held request that its engine core would let preempt a running one
(:class:`~llmfleet.policies.request.preemption.PreemptionRule`: a higher priority than some request
there, or a tenant below its fair share of the engine's slots), instead of the request waiting in the
hold queue for a slot to free.

The scheduler does not see which of an engine's requests run and which wait there, so every request
it knows on the engine (``present``: what it sent and the engine's last report names, less those
that ended) counts as holding a slot. That keeps the rule self-limiting: a request sent this way counts
from then on, so a claimant is sent only while the requests of its priority and above fill fewer
than the engine's batch (``slots``), or while its tenant, counting the ones it sent already, is below
its fair share plus credit (``slot_credit``: the scheduler and the simulator keep one tracker per
engine, fed the requests present there whenever they weigh it); past that it waits here as before. The head of the hold queue goes first when it may;
else the first held request that may (:func:`first_preempting`: a light key's request behind the
head of a heavy key's backlog, since VTC charges a request when it leaves). Pure: the scheduler's capacity gate
(``llmfleet_scheduler.capacity``) and the simulator's holds (``llmfleet.sim.holds``) both ask
:func:`may_preempt` and :func:`first_preempting`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from llmfleet.policies.request.preemption import Claim, PreemptionRule

T = TypeVar("T")


def may_preempt(
    claimant: Claim,
    present: Sequence[Claim],
    slots: int,
    rule: PreemptionRule | None,
    credit: Mapping[str, float] | None = None,
) -> bool:
    """Whether a saturated engine running at most ``slots`` requests, holding ``present``, may take
    ``claimant`` because its core would preempt one of them for it (``rule`` None: preemption is off).
    ``credit``: the engine's tenants' fairness credit in ``claimant``'s band
    (:class:`~llmfleet.policies.request.slot_credit.EngineCredits`)."""
    if rule is None or slots <= 0 or not present:
        return False
    return rule.victim(claimant, present, slots, credit=credit) is not None


def first_preempting(held: Iterable[T], may: Callable[[T], bool], kind: Callable[[T], Hashable]) -> T | None:
    """The first of the held requests (in queue order) that ``may`` preempt on a saturated engine: it
    leaves the hold queue out of turn (the head, which may not, keeps waiting for a slot); None: none.
    ``may`` is asked once per ``kind`` (the (priority, tenant) the rule reads): the oldest of each."""
    seen: set[Hashable] = set()
    for item in held:
        k = kind(item)
        if k in seen:
            continue
        seen.add(k)
        if may(item):
            return item
    return None
