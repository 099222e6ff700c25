"""Arrivals waiting for capacity, as in the live scheduler (``llmfleet.policies.capacity``); a
part of :class:`~llmfleet.sim.fleet.Fleet`.

A request for a model no instance serves waits when some instance is loading it; else, with a placement
loop installed (the fleet's ``wake``) and ``cold_start`` on, it waits up to its service's cold-start
timeout and wakes the loop at once (scale from zero); else it fails with the reason. With late binding a
request whose model's every instance is saturated (``Saturation``) waits too, and goes to the first
instance with room (at a step end, or when an instance is ready); the first of them (the model's queue
was empty) wakes the placement loop too, as the live scheduler's report does. Waiting requests are
dispatched in the order of the live scheduler's hold queue (``llmfleet.policies.capacity.queues``,
the fleet's ``fairness``): their priority (their own, or their service's), then fair among tenants by
weighted tokens served (every admission of the model charges its tenant, held or not), then arrival;
a sheddable one (negative priority) is dropped at its service's TTFT SLO. No other request is lost.
With every instance saturated, the head goes to an instance whose core would preempt one of its
requests for it (``llmfleet.policies.capacity.preempt_room``, the live gate's rule: a higher priority;
with ``fairness`` vtc, a tenant below its fair share of the instance's slots plus its credit, kept per
instance as the live gate keeps it per engine).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.policies.capacity import HeldQueue, cold_start_timeout_s, make_hold_queue, weighted_tokens
from llmfleet.policies.capacity.preempt_room import first_preempting, may_preempt
from llmfleet.policies.capacity.priority import request_priority, sheddable
from llmfleet.policies.dispatch import HostList, NoCandidate
from llmfleet.policies.request.preemption import Claim, PreemptionRule, under_hold_queue
from llmfleet.policies.request.slot_credit import EngineCredits
from llmfleet.sim.fleet_view import FleetView
from llmfleet.sim.records import RequestRecord

COLD, SATURATED = "cold", "saturated"


@dataclass(slots=True)
class Held:
    """An arrival waiting for capacity: ``reason`` cold (no instance serves its model) or saturated
    (late binding: every instance serving it is full); ``deadline`` of a cold wait (inf: none)."""

    rec: RequestRecord
    predicted: float | None
    reason: str
    deadline: float = float("inf")


def _kind(h: Held) -> tuple[int | None, str, str]:
    """What the preemption rule reads of a held request (``first_preempting`` asks once per kind)."""
    return (h.rec.priority, h.rec.tenant, h.rec.service)


class Saturated(LookupError):
    """Late binding: every instance serving the model is saturated (the request waits)."""


class Holds:
    """Per model, the arrivals waiting for capacity; it reads the fleet's capacity settings (``binding``,
    ``saturation``, ``cold_start``, ``wake``) and places requests through its public API."""

    def __init__(self, fleet: FleetView) -> None:
        self.fleet = fleet
        # model -> arrivals waiting for capacity (kept when empty: its tenants' counters)
        self.queues: dict[str, HeldQueue[Held]] = {}
        self._credit = EngineCredits()  # each instance's tenants' fairness credit
        # model -> held requests with a priority or a tenant (ids; some may have left since): where every
        # engine's claims are alike, only these may preempt, so the hold queue need not be walked
        self._unlike: dict[str, set[str]] = {}

    @property
    def preemption(self) -> PreemptionRule | None:
        """Late binding's preemption rule, as the live gate's: the instances' cores' rule, with fairness
        among tenants only under vtc (None: no preemption)."""
        return under_hold_queue(self.fleet.preemption, self.fleet.fairness == "vtc")

    def __contains__(self, model: str) -> bool:
        return bool(self.queues.get(model))

    def __bool__(self) -> bool:
        return any(self.queues.values())

    def _queue(self, model: str) -> HeldQueue[Held]:
        q = self.queues.get(model)
        if q is None:
            q = self.queues[model] = make_hold_queue(self.fleet.fairness)
        return q

    def served(self, rec: RequestRecord) -> None:
        """``rec`` is admitted to an instance: its tenant is charged its weighted tokens."""
        self._queue(rec.model).charge(rec.tenant, weighted_tokens(rec.prompt_tokens, rec.output_tokens))

    def ahead(self, model: str) -> bool:
        """Requests of ``model`` already wait (a new arrival goes behind them)."""
        return bool(self.queues.get(model))

    def held(self) -> dict[str, int]:
        """Per service: arrivals waiting for capacity now (cold or saturated)."""
        out: dict[str, int] = {}
        for q in self.queues.values():
            for h in q.items():
                out[h.rec.service] = out.get(h.rec.service, 0) + 1
        return out

    def room(self, model: str, cands: HostList | None) -> HostList | None:
        """Late binding: the candidates serving ``model`` with room (None: early binding, all of them);
        raises :class:`Saturated` when some serve it and none has room."""
        if self.fleet.binding != "late" or not cands:
            return None  # nobody serves it: NoCandidate (a cold wait), not saturation
        room = self.fleet.saturation.with_room(cands)
        if not room:
            raise Saturated(model)
        return HostList(model, room) if len(room) < len(cands) else cands

    def hold(self, rec: RequestRecord, predicted: float | None, reason: str = COLD) -> bool:
        """Keep an arrival that no instance can take now; False (it fails) when nothing will ever bring
        capacity for it."""
        fleet = self.fleet
        q = self._queue(rec.model)
        if reason == SATURATED and not q and fleet.wake is not None:
            fleet.wake(fleet.events.now)  # a queue starts to build: the placement loop plans now
        held = Held(rec, predicted, reason)
        if reason == COLD and not fleet.coming(rec.model) and not self._cold_wait(held):
            return False
        svc = fleet.service(rec.service)
        priority = request_priority(rec.priority, svc.priority, None)
        if sheddable(priority) and svc.slo.ttft_s is not None:  # dropped at its TTFT SLO
            shed_at = rec.arrival_s + svc.slo.ttft_s
            model, rid = rec.model, rec.request_id
            fleet.events.at(shed_at, lambda sim, t: self._expire(model, rid, t, shed=True))
        cost = weighted_tokens(rec.prompt_tokens, rec.output_tokens)  # what ``served`` charges it
        q.push(rec.request_id, held, rec.arrival_s, priority, held.deadline, rec.tenant, cost)
        if priority or rec.tenant:
            self._unlike.setdefault(rec.model, set()).add(rec.request_id)
        if reason == SATURATED:  # it may preempt now, not at the next step end
            iid = self.preemptible(rec, svc.routed_model)
            if iid is not None:
                q.remove(rec.request_id)  # admit charges its tenant
                fleet.admit(rec, svc, iid, predicted, fleet.events.now)
        return True

    def _cold_wait(self, held: Held) -> bool:
        """Start ``held``'s cold wait (bounded; the placement loop woken now); False when there is no loop
        to place its model or cold starts are off."""
        fleet = self.fleet
        if not fleet.cold_start or fleet.wake is None:
            return False
        svc = fleet.service(held.rec.service)
        now = fleet.events.now
        held.deadline = now + cold_start_timeout_s(svc.cold_start_timeout_s, svc.slo.ttft_s)
        model, rid = held.rec.model, held.rec.request_id
        fleet.events.at(held.deadline, lambda sim, t: self._expire(model, rid, t))
        fleet.wake(now)
        return True

    def _expire(self, model: str, request_id: str, now: float, shed: bool = False) -> None:
        q = self.queues.get(model)
        held = q.remove(request_id) if q is not None else None
        if held is None:
            return
        waited = now - held.rec.arrival_s
        held.rec.failed = (
            f"shed after waiting {waited:.1f}s (sheddable, at its TTFT SLO)"
            if shed
            else f"no instance loaded model {model!r} within {waited:.1f}s (the cold-start timeout)"
        )

    def serve(self, model: str, now: float) -> None:
        """Dispatch ``model``'s waiting arrivals, in order, while an instance can take them."""
        fleet = self.fleet
        q = self.queues.get(model)
        while q:
            held = q.peek()
            assert held is not None
            rec = held.rec
            svc = fleet.service(rec.service)
            req = fleet.dispatch_request(
                rec.request_id, svc, rec.prompt_tokens, held.predicted, now, *fleet.prompt_of(rec.content)
            )
            try:
                iid = fleet.pick_instance(svc, req, frozenset(), late=True)
            except NoCandidate:
                return
            except Saturated:
                self._serve_preempting(model, q, now)
                return
            q.remove(rec.request_id)  # the head; admit charges its tenant
            fleet.admit(rec, svc, iid, held.predicted, now)

    def _serve_preempting(self, model: str, q: HeldQueue[Held], now: float) -> None:
        """Every instance is saturated for the head: admit the held requests that may preempt on one
        (``first_preempting``), out of turn, while there are such."""
        fleet = self.fleet
        unlike = self._unlike.get(model)
        if unlike:
            unlike.intersection_update([rid for rid in unlike if rid in q])
        if not unlike and not any(inst.core.claims_differ for inst in fleet.instances.values()):
            return  # every claim held and placed is priority 0 with no tenant: none may preempt
        where: dict[str, str] = {}

        def may(h: Held) -> bool:
            iid = self.preemptible(h.rec, fleet.service(h.rec.service).routed_model)
            if iid is not None:
                where[h.rec.request_id] = iid
            return iid is not None

        while (h := first_preempting(q.items(), may, _kind)) is not None:
            q.remove(h.rec.request_id)  # admit charges its tenant
            fleet.admit(h.rec, fleet.service(h.rec.service), where[h.rec.request_id], h.predicted, now)

    def preemptible(self, rec: RequestRecord, model: str) -> str | None:
        """A saturated instance serving ``model`` whose core would preempt one of its requests for
        ``rec`` (the first by id); None: none."""
        priority = request_priority(rec.priority, self.fleet.service(rec.service).priority, None)
        me = Claim(rec.request_id, priority, rec.tenant, rec.arrival_s)
        alike = me.priority == 0 and not me.tenant
        for iid in sorted(self.fleet.instances):
            inst = self.fleet.instances[iid]
            if model not in inst.models:
                continue
            core = inst.core
            if alike and not core.claims_differ:
                continue  # every claim there is priority 0 with no tenant, as ``rec``'s: no victim
            present = [core.claim(r) for r in core.requests.values()]
            slots = core.limits.max_running
            credit = self._credit.band(
                iid, self.preemption, self.fleet.events.now, present, slots, me.priority
            )
            if may_preempt(me, present, slots, self.preemption, credit):
                return iid
        return None

    def check(self, now: float) -> None:
        """Serve the waiting arrivals of models an instance serves; those of models no instance serves or
        loads any more start a cold wait (or fail, when none can start)."""
        for model in list(self.queues):
            if self.fleet.serves(model):
                self.serve(model, now)
            elif not self.fleet.coming(model):
                q = self.queues[model]
                for held in q.items():
                    if held.deadline == float("inf") and not self._cold_wait(held):
                        q.remove(held.rec.request_id)
                        held.rec.failed = (
                            f"no instance serves model {model!r}: no instance hosts it any more (its load was "
                            "cancelled)"
                        )
                    else:
                        held.reason = COLD
                        q.set_deadline(held.rec.request_id, held.deadline)

    def fail_all(self, why: str) -> None:
        """Every waiting arrival fails with ``why``."""
        for model, q in self.queues.items():
            for held in q.items():
                q.remove(held.rec.request_id)
                held.rec.failed = f"no instance serves model {model!r}: {why}"
