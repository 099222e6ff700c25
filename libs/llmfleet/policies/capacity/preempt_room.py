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
its fair share; past that it waits here as before. Pure: the scheduler's capacity gate
(``llmfleet_scheduler.capacity``) and the simulator's holds (``llmfleet.sim.holds``) both ask
:func:`may_preempt`.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.policies.request.preemption import Claim, PreemptionRule


def may_preempt(claimant: Claim, present: Sequence[Claim], slots: int, rule: PreemptionRule | None) -> bool:
    """Whether a saturated engine running at most ``slots`` requests, holding ``present``, may take
    ``claimant`` because its core would preempt one of them for it (``rule`` None: preemption is off)."""
    if rule is None or slots <= 0 or not present:
        return False
    return rule.victim(claimant, present, slots) is not None
