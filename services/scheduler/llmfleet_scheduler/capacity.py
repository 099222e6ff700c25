"""Requests wait for capacity in the scheduler instead of failing.

:class:`CapacityGate` stands between a request and its dispatch policy:

* **Scale from zero.** No engine hosts the request's model: the request waits (``cold``), the
  placement leader is woken at once (``on_wait``: the stats reporter sends a report now, which counts
  the waiting requests as demand), and the request is dispatched when an engine reports the model
  loaded. Past the service's cold-start timeout (``llmfleet.policies.capacity.cold_start``) it fails
  UNAVAILABLE with a retry-after. A model larger than every engine fails at once
  (FAILED_PRECONDITION naming it and the largest engine), and so does one the placement leader says it
  will not place (``llmfleet.coord.unplaced``: the static policy lists it nowhere, or a planner left
  its service out).
* **Late binding** (``binding="late"``). Every engine hosting the model is saturated
  (``llmfleet.policies.capacity.Saturation``: its queue past its batch plus a slack, or its KV pool
  nearly full): the request waits here (``saturated``) instead of in one engine's queue, and goes to
  the first engine with room. Capacity that scaling adds then serves the queue at once. The first
  request held this way (the model's queue was empty) wakes placement too: a burst scales out now.
  A request that the engine's core would let preempt one it holds (a higher priority than one there;
  with ``fairness="vtc"``, an API key below its fair share of the engine's slots plus its credit,
  ``llmfleet.policies.request.slot_credit``, kept per engine) goes to that saturated engine instead of
  waiting (``llmfleet.policies.capacity.preempt_room``, over the requests the load book places there
  and their classes).

Waiting requests are kept per model in a hold queue (``llmfleet.policies.capacity.queues``):
the request's priority (its own, or its service's), then, with ``fairness="vtc"``, the API key with
the fewest weighted tokens served (``llmfleet.policies.capacity.vtc_fair``; every dispatch of the model
is charged, held or not, and settled with the tokens generated when the request ends), then arrival. A
pump dispatches them in that order whenever capacity may have changed: a load report came in, a
request ended, the engine set changed, or ``poll_s`` passed. The pump takes the dispatch policy's
choice for the head of the queue and records it in the load book at once, so the next head sees it. A
cancelled request leaves the queue at once and is never dispatched.

**Priorities under overload.** Admission control asks :meth:`CapacityGate.displace` for room before it
refuses a request: the held request of the same service that would leave last is refused instead,
when it would leave after the new one (a lower priority, or the same from a key served more tokens). A sheddable request (negative priority) is dropped when it has waited its service's
TTFT SLO less ``poll_s`` (so it never waits past it). Both end RESOURCE_EXHAUSTED with a retry-after
through ``refuse`` (the servicer fails the request's record), then their wait ends with :class:`Shed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmfleet.costmodel import UnknownModel, model_arch
from llmfleet.load import LoadReport
from llmfleet.metrics.control import SchedulerMetrics, scheduler_metrics
from llmfleet.policies.capacity import (
    BINDINGS,
    HeldQueue,
    Saturation,
    Unplaceable,
    make_hold_queue,
    unplaceable,
    weighted_tokens,
)
from llmfleet.policies.capacity.cold_start import EngineSize, cold_start_timeout_s
from llmfleet.policies.capacity.preempt_room import first_preempting, may_preempt
from llmfleet.policies.capacity.priority import sheddable
from llmfleet.policies.dispatch import DispatchPolicy, DispatchRequest, EngineCandidate, NoCandidate
from llmfleet.policies.request.preemption import Claim, PreemptionRule, under_hold_queue
from llmfleet.policies.request.slot_credit import EngineCredits
from llmfleet.spec.defaults import FAIRNESS, Binding, Fairness
from llmfleet.spec.services import ServiceSpec

from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.priorities import RequestClass, RequestClasses

log = logging.getLogger(__name__)

COLD, SATURATED = "cold", "saturated"


class ColdStartTimeout(Exception):
    """No engine loaded the model within the service's cold-start timeout."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Shed(ColdStartTimeout):
    """The request left the hold queue refused: displaced by a higher priority, or sheddable and at its
    TTFT SLO. Its record already failed RESOURCE_EXHAUSTED (``CapacityGate.refuse``); as a
    ColdStartTimeout, the relay's own failure of it changes nothing."""


@dataclass
class _Waiter:
    request_id: str
    spec: ServiceSpec
    policy: DispatchPolicy
    request: DispatchRequest
    excluded: frozenset[str]
    future: asyncio.Future[str]
    since: float
    reason: str  # COLD or SATURATED (what it waits for now)
    cold_since: float | None = None  # since when it waits for its model to be loaded
    was_cold: bool = False  # it waited for a load at some point (a cold start)
    cls: RequestClass | None = None  # its priority and API key (None: the service's priority, no key)

    @property
    def priority(self) -> int:
        return self.cls.priority if self.cls is not None else self.spec.priority


@dataclass
class CapacityGate:
    directory: ClusterDirectory
    binding: Binding = "early"  # see spec.defaults.Binding
    saturation: Saturation = field(default_factory=Saturation)
    cold_start: bool = True  # False: no engine hosting the model fails at once (the old behaviour)
    metrics: SchedulerMetrics = field(default_factory=scheduler_metrics)  # the held/cold-start metrics
    # a request of the service waits (cold, or the first to find every engine saturated): wake placement
    on_wait: Callable[[str], None] | None = None
    poll_s: float = 0.25  # re-check this often even when nothing signals a change
    clock: Callable[[], float] = time.monotonic
    fairness: Fairness = FAIRNESS  # the order within a priority (see llmfleet.policies.capacity.queues)
    # each request's priority and API key, by id, and their metrics (None: every request at its
    # service's priority, no key)
    classes: RequestClasses | None = None
    # fail a request's record (request id, message, retry-after s) RESOURCE_EXHAUSTED: displaced or shed
    refuse: Callable[[str, str, int], None] | None = None
    # late binding sends a request to a saturated engine whose core would preempt for it (None: never);
    # its fairness half follows ``fairness`` ("none": priorities only)
    preemption: PreemptionRule | None = field(default_factory=PreemptionRule)
    _queues: dict[str, HeldQueue[_Waiter]] = field(default_factory=dict)  # per model (kept: its counters)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _weights: dict[str, int] = field(default_factory=dict)  # model -> weight bytes (0: unknown)
    _credit: EngineCredits = field(default_factory=EngineCredits)  # each engine's tenants' fairness credit

    def __post_init__(self) -> None:
        if self.binding not in BINDINGS:
            raise ValueError(f"binding must be one of {BINDINGS}, got {self.binding!r}")
        self.preemption = under_hold_queue(self.preemption, self.fairness == "vtc")

    # ------------------------------------------------------------------------------------ requests
    async def place(
        self, spec: ServiceSpec, policy: DispatchPolicy, request: DispatchRequest, excluded: frozenset[str]
    ) -> str:
        """The engine for ``request``, waiting here while there is none with room. Raises NoCandidate
        (every host excluded; or no host and cold starts off), :class:`Unplaceable` or
        :class:`ColdStartTimeout`."""
        model = request.model
        cls = self.classes.get(request.request_id) if self.classes is not None else None
        queue = self._queues.get(model)
        if queue is None:
            queue = self._queues[model] = make_hold_queue(self.fairness)
        if not queue:  # nobody waits ahead of it: decide now
            got = self._decide(model, policy, request, excluded, cls)
            if not isinstance(got, _Hold):
                self._charge(queue, cls, request)
                return got
            reason = got.reason
        else:
            head = queue.peek()
            reason = head.reason if head is not None else SATURATED
        now = self.clock()
        waiter = _Waiter(
            request.request_id, spec, policy, request, excluded,
            asyncio.get_running_loop().create_future(), now, reason, cls=cls,
        )  # fmt: skip
        first = not queue
        queue.push(
            request.request_id, waiter, request.arrival_s, waiter.priority, self._deadline(waiter, now),
            cls.key if cls is not None else "", _cost(cls, request),
        )  # fmt: skip
        self._held(waiter, +1)
        if first and reason == SATURATED:
            self._wake(spec.name)
        self.notify()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            queue.remove(request.request_id)
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self.directory.load.released(waiter.future.result(), request.request_id)
            self._outcome(waiter, "cancelled")
            raise
        finally:
            self._held(waiter, -1)

    def notify(self) -> None:
        """Capacity may have changed (a load report, an end, the engine set): the pump looks again."""
        self._changed.set()

    # a LoadMonitor listener: every engine load report (and every engine leaving) wakes the pump
    def report(self, engine_id: str, report: LoadReport) -> None:
        self.notify()

    def forget(self, engine_id: str) -> None:
        self._credit.forget(engine_id)
        self.notify()

    def displace(self, service: str, priority: int, key: str, retry_after_s: int) -> bool:
        """Refuse the held request of ``service`` that would leave last, when it would leave after one
        of ``priority`` from API key ``key`` (a lower priority; with fairness, the same priority of a
        key served more tokens), to make room for that one (admission control's overload); False when
        there is none."""
        for queue in self._queues.values():
            rid = queue.last_behind(priority, key, lambda w: w.spec.name == service)
            if rid is None:
                continue
            w = queue.remove(rid)
            assert w is not None
            self._refuse(
                w,
                f"service {service!r} is overloaded: a request of priority {priority} took the place of "
                f"this one (priority {w.priority}, which would have left later); retry after {retry_after_s}s",
                retry_after_s,
                "refused",
            )
            return True
        return False

    def held(self) -> dict[str, tuple[int, int]]:
        """Per service: (requests held here, of them cold)."""
        out: dict[str, list[int]] = {}
        for q in self._queues.values():
            for w in q.items():
                n = out.setdefault(w.spec.name, [0, 0])
                n[0] += 1
                n[1] += w.reason == COLD
        return {k: (v[0], v[1]) for k, v in out.items()}

    # ------------------------------------------------------------------------------------ the pump
    async def run(self) -> None:
        """Dispatch held requests whenever capacity may have changed; expire cold waits."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.poll_s)
            self._changed.clear()
            try:
                self.pump()
            except Exception:  # a bad round must not stop the pump
                log.exception("capacity gate: a dispatch round failed")

    def pump(self) -> int:
        """One round over every model's queue; returns the number of requests dispatched."""
        now = self.clock()
        sent = 0
        for model, queue in list(self._queues.items()):
            for w in queue.expired(now):
                self._expire(w, now)
            while (w := queue.peek()) is not None:
                if w.future.done():
                    queue.remove(w.request_id)
                    continue
                try:
                    got = self._decide(model, w.policy, w.request, w.excluded, w.cls)
                except (NoCandidate, Unplaceable) as e:
                    queue.remove(w.request_id)
                    w.future.set_exception(e)
                    self._outcome(w, "unplaceable" if isinstance(e, Unplaceable) else "failed")
                    continue
                if isinstance(got, _Hold):
                    self._set_reason(queue, w, got.reason, now)
                    if got.reason == SATURATED and self._send_preempting(model, queue, now):
                        sent += 1
                        continue  # the head may find room or a claimant again
                    break
                queue.pop()  # the head: charged to its key
                self._settle(queue, w.cls)
                kv = w.request.prompt_tokens * w.request.kv_bytes_per_token
                self.directory.load.dispatched(got, w.request_id, kv)  # the next head sees it
                w.future.set_result(got)
                self._waited(w, now)
                sent += 1
        return sent

    # ------------------------------------------------------------------------------------ decisions
    def _decide(
        self,
        model: str,
        policy: DispatchPolicy,
        request: DispatchRequest,
        excluded: frozenset[str],
        cls: RequestClass | None = None,
    ) -> str | _Hold:
        cands = self.directory.candidates(progress=policy.needs.reads_progress)
        hosts = [c for c in cands if model in c.models]
        if not hosts:
            if not self.cold_start:
                return policy.choose(model, cands, excluded, request=request)  # raises NoCandidate
            why = self._unplaceable(model)
            if why is not None:
                raise Unplaceable(why)
            left_out = self.directory.unplaced(model)
            if left_out is not None:
                raise Unplaceable(f"placement does not place model {model!r}: {left_out}")
            return _Hold(COLD)
        if self.binding == "late":
            usable = [c for c in hosts if c.engine_id not in excluded]
            if usable:
                book = self.directory.load
                room = [c for c in usable if self.saturation.has_room(c, book.occupancy(c.engine_id))]
                if not room:
                    room = self._preemptible(usable, request, cls)
                if not room:
                    return _Hold(SATURATED)
                return policy.choose(model, room, excluded, request=request)
        return policy.choose(model, cands, excluded, request=request)

    def _send_preempting(self, model: str, queue: HeldQueue[_Waiter], now: float) -> bool:
        """Every host is saturated for the head: dispatch the first held request that may preempt on
        one (``first_preempting``), out of turn and charged; False when none may."""
        hosts = [c for c in self.directory.candidates() if model in c.models]
        found: dict[str, list[EngineCandidate]] = {}

        def may(w: _Waiter) -> bool:
            if w.future.done() or w.reason != SATURATED:
                return False
            usable = [c for c in hosts if c.engine_id not in w.excluded]
            found[w.request_id] = self._preemptible(usable, w.request, w.cls)
            return bool(found[w.request_id])

        w = first_preempting(queue.items(), may, _kind)
        if w is None:
            return False
        got = w.policy.choose(model, found[w.request_id], w.excluded, request=w.request)
        queue.remove(w.request_id)
        self._charge(queue, w.cls, w.request)
        self.directory.load.dispatched(
            got, w.request_id, w.request.prompt_tokens * w.request.kv_bytes_per_token
        )
        w.future.set_result(got)
        self._waited(w, now)
        return True

    def _preemptible(
        self, hosts: list[EngineCandidate], request: DispatchRequest, cls: RequestClass | None
    ) -> list[EngineCandidate]:
        """The saturated ``hosts`` whose core would preempt one of the requests placed there for
        ``request`` (``preempt_room``)."""
        rule, classes = self.preemption, self.classes
        if rule is None or cls is None or classes is None:
            return []
        me = Claim(request.request_id, cls.priority, cls.key, request.arrival_s)
        now = self.clock()
        out = []
        for c in hosts:
            present = []
            for rid in self.directory.load.placed(c.engine_id):
                other = classes.get(rid)
                present.append(Claim(rid, other.priority, other.key) if other is not None else Claim(rid))
            credit = self._credit.band(c.engine_id, rule, now, present, c.max_running, me.priority)
            if may_preempt(me, present, c.max_running, rule, credit):
                out.append(c)
        return out

    def _unplaceable(self, model: str) -> str | None:
        weight = self._weights.get(model)
        if weight is None:
            name = self.directory.sim_model(model) or model
            try:
                weight = model_arch(name).weight_bytes
            except UnknownModel:
                weight = 0
            self._weights[model] = weight
        sizes = [EngineSize(n.node_id, n.memory_bytes) for n in self.directory.engines().values()]
        return unplaceable(model, weight, sizes)

    def _shed_at(self, w: _Waiter) -> float:
        """When a sheddable ``w`` is dropped: its TTFT SLO less a poll, after it arrived here (never
        when its service has no TTFT SLO)."""
        ttft = w.spec.slo.ttft_s
        if not sheddable(w.priority) or ttft is None:
            return math.inf
        return w.since + max(0.0, ttft - self.poll_s)

    def _deadline(self, w: _Waiter, now: float) -> float:
        if w.reason != COLD:
            return self._shed_at(w)
        w.cold_since = w.cold_since if w.cold_since is not None else now
        w.was_cold = True
        cold = w.cold_since + cold_start_timeout_s(w.spec.cold_start_timeout_s, w.spec.slo.ttft_s)
        return min(cold, self._shed_at(w))

    def _set_reason(self, queue: HeldQueue[_Waiter], w: _Waiter, reason: str, now: float) -> None:
        if reason == w.reason:
            return
        self._held(w, -1)
        w.reason = reason
        self._held(w, +1)
        if reason != COLD:
            w.cold_since = None
        queue.set_deadline(w.request_id, self._deadline(w, now))

    def _expire(self, w: _Waiter, now: float) -> None:
        if w.future.done():
            return
        if now >= self._shed_at(w):
            retry = max(1, math.ceil(w.spec.slo.ttft_s or 0))
            self._refuse(
                w,
                f"service {w.spec.name!r}: shed after waiting {now - w.since:.1f}s for capacity (priority "
                f"{w.priority} is sheddable; the service's TTFT SLO is {w.spec.slo.ttft_s:g}s); retry after "
                f"{retry}s",
                retry,
                "shed",
            )
            self.metrics.held_seconds.labels(w.spec.name, w.reason).observe(now - w.since)
            return
        waited = now - (w.cold_since if w.cold_since is not None else w.since)
        retry = max(1, math.ceil(cold_start_timeout_s(w.spec.cold_start_timeout_s, w.spec.slo.ttft_s) / 2))
        w.future.set_exception(
            ColdStartTimeout(
                f"no engine loaded model {w.request.model!r} within {waited:.1f}s (the service's cold-start "
                f"timeout); placement may still be loading it",
                retry,
            )
        )
        self._outcome(w, "timeout")
        self.metrics.held_seconds.labels(w.spec.name, w.reason).observe(waited)

    def _refuse(self, w: _Waiter, message: str, retry_after_s: int, outcome: str) -> None:
        """End held ``w`` RESOURCE_EXHAUSTED (displaced or shed): its record fails through ``refuse``."""
        if self.refuse is not None:
            self.refuse(w.request_id, message, retry_after_s)
        w.future.set_exception(Shed(message, retry_after_s))
        if w.cls is not None and self.classes is not None:
            self.classes.count(w.cls, outcome)
        self._outcome(w, outcome)

    # ------------------------------------------------------------------------------------ accounting
    def _charge(self, queue: HeldQueue[_Waiter], cls: RequestClass | None, request: DispatchRequest) -> None:
        """A request dispatched without waiting is served too: its key is charged."""
        if cls is not None:
            queue.charge(cls.key, _cost(cls, request))
            self._settle(queue, cls)

    def _settle(self, queue: HeldQueue[_Waiter], cls: RequestClass | None) -> None:
        """At its end, the request's charge is corrected with the output tokens it generated."""
        if cls is not None:
            charged = cls.output_tokens
            cls.settle = lambda generated: queue.charge(cls.key, weighted_tokens(0, generated - charged))

    def _held(self, w: _Waiter, delta: int) -> None:
        if delta > 0 and w.reason == COLD:
            self._wake(w.spec.name)
        self.metrics.held.labels(w.spec.name, w.reason).inc(delta)

    def _wake(self, service: str) -> None:
        if self.on_wait is not None:
            try:
                self.on_wait(service)
            except Exception:
                log.exception("capacity gate: waking placement failed")

    def _waited(self, w: _Waiter, now: float) -> None:
        self.metrics.held_seconds.labels(w.spec.name, w.reason).observe(now - w.since)
        if w.cls is not None and self.classes is not None:
            self.classes.waited(w.cls, now - w.since)
        self._outcome(w, "served")

    def _outcome(self, w: _Waiter, outcome: str) -> None:
        if w.was_cold:
            self.metrics.cold_starts.labels(w.spec.name, outcome).inc()


def _kind(w: _Waiter) -> tuple[object, ...]:
    """What decides whether a held request may preempt (``first_preempting`` asks once per kind)."""
    return (w.priority, w.cls.key if w.cls is not None else None, w.excluded, w.reason, w.future.done())


@dataclass(frozen=True)
class _Hold:
    reason: str


def _cost(cls: RequestClass | None, request: DispatchRequest) -> float:
    """The weighted tokens a request is charged when it leaves: its prompt and its output cap."""
    out = cls.output_tokens if cls is not None else request.predicted_output_tokens
    return weighted_tokens(request.prompt_tokens, out)
