"""Requests moving between simulated instances (a part of :class:`~llmfleet.sim.fleet.Fleet`).

A request leaves its instance between two steps (a member of the step in flight leaves when that step
ends, the step cut to its current iteration, as a live engine pauses a request between steps to export
it), travels for its transfer time (a ``MOVE`` event) and joins the destination at its next step
boundary, with its KV (``EngineCore.land``: it re-prefills prompt + output when the KV does not fit
there) or, for a token transfer, without it. A request of a LoRA adapter moves to an instance with
its base's adapter pool and takes the adapter's slot there as it lands (the engine core's adapter rule:
with its KV when a slot is free or evictable, else it re-prefills once it gets one). A request whose
model left the destination meanwhile is dispatched again among the instances serving it."""

from __future__ import annotations

from llmfleet.engine_core import CoreRequest
from llmfleet.policies.dispatch import NoCandidate
from llmfleet.sim.events import MOVE, EventQueue
from llmfleet.sim.fleet_view import FleetView
from llmfleet.sim.instance import SimInstance, record_of


class Moves:
    """The requests in transit: how many, which re-prefill on landing; it moves them through ``fleet``'s
    public API."""

    def __init__(self, fleet: FleetView, events: EventQueue) -> None:
        self.fleet = fleet
        self.events = events
        self.moving = 0  # requests on their way (a MOVE event pending)
        self._reprefill: set[str] = set()  # moving requests whose KV stays behind (token transfer)

    def move_request(
        self, request_id: str, instance_id: str, transfer_s: float, now: float, *, reprefill: bool = False
    ) -> bool:
        """See :meth:`~llmfleet.sim.fleet.Fleet.move_request`."""
        fleet = self.fleet
        src = fleet.locate(request_id)
        dst = fleet.instances.get(instance_id)
        if src is None or dst is None or src is dst or transfer_s < 0 or request_id in src.outbound:
            return False
        r = src.core.requests.get(request_id)
        if r is None or r.sched.model not in dst.tpb:
            return False  # not here, or the destination cannot host it
        if r.adapter and r.sched.model not in dst.adapter_slots:
            return False  # a LoRA adapter's request needs the destination's adapter pool of its base
        if src.core.in_flight(request_id):
            src.outbound[request_id] = (instance_id, transfer_s, reprefill)
            fleet.kick(src, now)  # cut a fast-forwarded chunk to the iteration in progress
            return True
        self.detach(r, src, dst, transfer_s, now, reprefill)
        fleet.kick(src, now)
        return True

    def detach(
        self,
        r: CoreRequest,
        src: SimInstance,
        dst: SimInstance,
        transfer_s: float,
        now: float,
        reprefill: bool,
    ) -> bool:
        """Take ``r`` out of ``src`` (between its steps) and send it to ``dst``; no kick."""
        request_id = r.request_id
        if src.core.remove(request_id) is None:
            return False  # in the step in flight
        self._carry_adapter(r, dst)
        record_of(r).moves += 1
        if reprefill:
            self._reprefill.add(request_id)
        self.fleet.track(request_id, dst)
        self.moving += 1
        dst.inbound[r.sched.model] = dst.inbound.get(r.sched.model, 0) + 1
        self.events.push(now + transfer_s, MOVE, r, dst)
        return True

    def flush_outbound(self, inst: SimInstance, now: float) -> None:
        """Moves asked for while their request was in the step that just ended."""
        moves = list(inst.outbound.items())
        inst.outbound.clear()
        fleet = self.fleet
        for rid, (dst_id, transfer_s, reprefill) in moves:
            r = inst.core.requests.get(rid)
            dst = fleet.instances.get(dst_id)
            if r is None or dst is None or fleet.locate(rid) is not inst or r.sched.model not in dst.tpb:
                continue  # finished (or failed) in that step, or the destination changed
            self.detach(r, inst, dst, transfer_s, now, reprefill)

    def move_out(self, src: SimInstance, r: CoreRequest, now: float) -> None:
        """Move a request of a model ``src`` is removing to an instance serving it (the dispatch policy
        picks it); it stays (drains) when none does."""
        fleet = self.fleet
        model = r.sched.model
        if not fleet.serves(model):
            return
        rec = record_of(r)
        svc = fleet.service(rec.service)
        req = fleet.dispatch_request(
            rec.request_id, svc, rec.prompt_tokens, r.sched.predicted_output_tokens, now,
            *fleet.prompt_of(rec.content),
        )  # fmt: skip
        try:
            dst = fleet.instances[fleet.pick_instance(svc, req, frozenset((src.instance_id,)))]
        except NoCandidate:
            return
        kv = r.kv_tokens if r.sched.phase == "decode" else 0
        self.detach(r, src, dst, fleet.kv_transfer_s(model, kv), now, False)

    def arrived(self, r: CoreRequest, dst: SimInstance, now: float) -> None:
        """A ``MOVE`` event: ``r`` is at ``dst``."""
        self.moving -= 1
        self.land(r, dst, now)

    def land(self, r: CoreRequest, dst: SimInstance, now: float) -> None:
        """The moved request arrives with its KV and joins ``dst`` at its next step boundary."""
        fleet = self.fleet
        if not self._land_guard(r, dst):  # its model left dst meanwhile: re-prefill where it is served
            rec = record_of(r)
            fleet.release(rec.request_id)
            svc = fleet.service(rec.service)
            req = fleet.dispatch_request(
                rec.request_id, svc, rec.prompt_tokens, r.sched.predicted_output_tokens, now,
                *fleet.prompt_of(rec.content),
            )  # fmt: skip
            try:
                dst = fleet.instances[fleet.pick_instance(svc, req, frozenset())]
            except NoCandidate as e:
                rec.failed = f"moved off an instance that unloaded its model, and {e}"
                return
            fleet.track(rec.request_id, dst)
            self._carry_adapter(r, dst)
            dst.core.land(r, now)
            rec.instance = dst.instance_id
            fleet.kick(dst, now)
            return
        if dst.work is not None or dst.core.static_batch is not None:
            dst.landing.append(r)  # it joins between steps (static: batches), where the free KV is exact
        else:
            self.join(r, dst, now)
        fleet.kick(dst, now)

    def join(self, r: CoreRequest, dst: SimInstance, now: float) -> None:
        """``r`` joins ``dst`` between two of its steps, with its KV unless it travelled without."""
        reprefill = r.request_id in self._reprefill
        if reprefill:
            self._reprefill.discard(r.request_id)
        kv = r.kv_tokens if r.sched.phase == "decode" and not reprefill else 0
        dst.core.land(r, now, kv_tokens=kv)
        record_of(r).instance = dst.instance_id

    def _carry_adapter(self, r: CoreRequest, dst: SimInstance) -> None:
        """A LoRA adapter's request takes its adapter's slot on ``dst`` as it lands (its KV along) or is
        admitted there (re-prefill), priced at its service's rank."""
        if r.adapter:
            dst.serve_adapter(r.adapter, self.fleet.service(record_of(r).service).lora_rank)

    @staticmethod
    def _land_guard(r: CoreRequest, dst: SimInstance) -> bool:
        """Count the landing of a moved request; False when ``dst`` no longer holds its model."""
        model = r.sched.model
        n = dst.inbound.get(model, 0)
        if n:
            dst.inbound[model] = n - 1
        return model in dst.tpb and dst.active
