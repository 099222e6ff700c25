"""The discrete-event cluster simulator.

Events (:class:`~llmfleet.sim.events.EventQueue`, ordered by time, then kind, then insertion): request
arrivals (read lazily from the workload, so a million requests cost one pending event), ends of engine
iterations (or chunks), periodic hooks, request moves and model loads. At an arrival the **dispatch
policy object** (``policies/dispatch``) picks an instance among those hosting the service's model, from
:class:`~llmfleet.policies.dispatch.EngineCandidate` load views kept current per instance; each instance
runs its own **request policy object** (``policies/request`` or ``policies/batching``) exactly as the live
engine does (:mod:`llmfleet.sim.instance`).

The instances and the requests on them are the :class:`~llmfleet.sim.fleet.Fleet` (``sim.fleet``), a
component with a public API: where a model is served and where a request is, dispatch, admission, holds
for capacity, moves and placement changes. The simulator owns the clock, the workload, the hooks and the
samples. Hooks for the controllers that act later: ``every(period_s, fn)`` calls ``fn(sim, now)`` each
period (epoch ticks for placement/migration), ``at(t, fn)`` once at ``t``; the fleet's changes
(``add_instance``, ``set_models``, ``retire_instance``, ``move_request``, ...) are reachable from the
simulator too. A dispatch policy with ``on_finish(request_id, engine_id, output_tokens, now)`` hears of
every completion (as in the live scheduler). A turn that follows another request arrives its think time
after that request finished (:mod:`llmfleet.workload.followups`). A central scheduler (``llmfleet.sim.scls_central``) takes
every arrival into its pool instead of dispatch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from llmfleet.engine_core.core import DEFAULT_PREEMPTION
from llmfleet.policies.batching import StaticBatchPolicy
from llmfleet.policies.dispatch import DispatchPolicy, EngineCandidate, FinishListener, NoCandidate
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import RequestPolicy
from llmfleet.policies.request.preemption import PreemptionRule
from llmfleet.sim.cost import CostBook
from llmfleet.sim.events import ARRIVAL, END, HOOK, MOVE, READY, SAMPLE, EventQueue
from llmfleet.sim.fleet import Fleet
from llmfleet.sim.holds import COLD, SATURATED, Saturated
from llmfleet.sim.instance import SimInstance
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.spec import SimService, SimSpec
from llmfleet.workload.followups import PREDECESSOR_FAILED, FollowUps

Predict = Callable[[str, int], float]  # (service, prompt_tokens) -> predicted output tokens
FinishCallback = Callable[[str, str, int, float], None]  # (request id, instance id, output tokens, now)


class Route(NamedTuple):
    """Where an arriving request goes: its service, predicted output length, and instance (None, with
    the reason in ``failed``, when no instance can take it)."""

    service: SimService
    predicted: float | None
    instance_id: str | None
    failed: str | None


class CentralScheduler(Protocol):
    """A central scheduler (``llmfleet.sim.scls_central``): it takes every arrival into its pool (and hands
    idle instances their batches through the fleet's ``on_idle``)."""

    @property
    def busy(self) -> bool: ...

    def intake(self, rec: RequestRecord, svc: SimService, predicted: float | None, now: float) -> None: ...


@dataclass(frozen=True)
class Sample:
    """Cluster state at ``t``: KV used/capacity bytes, GPUs of instances with work, requests inside.

    ``active_kv_capacity``: the KV capacity of the instances with work (KV utilization of active
    GPUs = kv_used / active_kv_capacity). ``kinds``: per instance kind (models, tp) its KV used and
    the capacity C of one instance, for :attr:`fluid_gpus`. ``active_mem_used`` / ``active_mem_capacity``:
    of the instances with work, weights + KV in use, and their GPUs' memory (tp × HBM): Mell's "GPU
    utilization (i.e., percentage of GPU memory in use)" (activation workspace and headroom not in use)."""

    t: float
    kv_used: int
    kv_capacity: int
    active_gpus: int
    in_system: int
    active_kv_capacity: int = 0
    kinds: tuple[tuple[tuple[str, ...], int, int, int], ...] = ()  # (models, tp, KV used, C), used > 0
    active_mem_used: int = 0
    active_mem_capacity: int = 0

    @property
    def fluid_gpus(self) -> int:
        """Mell's fluid lower bound at ``t``: the GPUs needed if KV could be split freely,
        Σ over instance kinds tp · ⌈ΣKV / C⌉."""
        return sum(tp * -(-used // cap) for _, tp, used, cap in self.kinds if cap > 0)


@dataclass
class SimResult:
    records: list[RequestRecord]
    samples: list[Sample]
    instances: list[dict]
    end_s: float
    events: int
    wall_s: float
    cost_sources: dict[str, str] = field(default_factory=dict)
    provisioned_gpus: int = 0  # the most GPUs in use at once
    workers: int = 1  # processes the run was split across (llmfleet.sim.partition)
    gpu_log: list[tuple[float, int]] = field(default_factory=list)  # (t, GPUs in use) at each change
    placement: list[dict] = field(default_factory=list)  # placement decisions (llmfleet.sim.replan)
    stopped_s: float | None = None  # when ``run``'s ``stop`` ended the run early (None: it ran to the end)


class Simulator:
    """The clock, the workload, the hooks and the samples around a :class:`~llmfleet.sim.fleet.Fleet`
    (see the module docstring): hooks reach the fleet's public API as ``sim.fleet``."""

    def __init__(
        self,
        spec: SimSpec,
        plan: Sequence[InstancePlan],
        make_policy: Callable[[], RequestPolicy | StaticBatchPolicy],
        dispatch: DispatchPolicy,
        cost: CostBook,
        *,
        fast_forward: bool = True,
        sample_period_s: float | None = None,
        predict: Predict | None = None,
        preemption: PreemptionRule | None = DEFAULT_PREEMPTION,
    ) -> None:
        self.spec = spec
        self.cost = cost
        self.dispatch = dispatch
        self.events = EventQueue()
        self.fleet = Fleet(
            spec, plan=plan, make_policy=make_policy, dispatch=dispatch, cost=cost, events=self.events,
            fast_forward=fast_forward, preemption=preemption,
        )  # fmt: skip
        self.predict = predict
        self.sample_period_s = sample_period_s
        self._hooks: list[tuple[float, Callable[[Simulator, float], None]]] = []
        # dispatchers that track what they placed (Aladdin, SCLS max-min) hear about completions
        self._on_finish = dispatch.on_finish if isinstance(dispatch, FinishListener) else None
        # a dispatcher with a scheduling heartbeat (Aladdin) places each arrival at the next beat
        self._heartbeat_s = float(getattr(dispatch, "heartbeat_s", 0.0) or 0.0)
        self._routes: list[Route] | None = None  # set in a partition: each arrival's route, decided upfront
        self._sample_origin: float | None = None  # set in a partition: the whole run's first arrival
        self.records: list[RequestRecord] = []
        self._pending = False  # arrivals not yet read (during run)
        self._follow: FollowUps | None = None  # closed-loop turns (during run)
        # central scheduling (llmfleet.sim.scls_central): arrivals go to its pool, idle instances ask it
        self.central: CentralScheduler | None = None

    @property
    def now(self) -> float:
        return self.events.now

    @property
    def instances(self) -> dict[str, SimInstance]:
        """The fleet's instances, by id."""
        return self.fleet.instances

    def candidates(self) -> list[EngineCandidate]:
        """Every serving instance as a dispatcher sees it now (:meth:`Fleet.candidates`)."""
        return self.fleet.candidates()

    # ---------------------------------------------------------------------------------------- hooks
    def every(self, period_s: float, fn: Callable[[Simulator, float], None]) -> None:
        """Call ``fn(sim, now)`` every ``period_s`` simulated seconds while requests remain."""
        if period_s <= 0:
            raise ValueError(f"hook period must be > 0, got {period_s}")
        self._hooks.append((period_s, fn))

    def at(self, t: float, fn: Callable[[Simulator, float], None]) -> None:
        """Call ``fn(sim, t)`` once at simulated time ``t`` (not before now)."""
        self.events.at(t, fn)

    # ------------------------------------------------------------------------------------- dispatch
    def route(self, wr, now: float) -> Route:
        """Predict and dispatch one arriving request: its service, prediction, and instance id (or why
        no instance can take it)."""
        fleet = self.fleet
        svc = fleet.service(wr.service)
        predicted = self.predict(svc.name, wr.prompt_tokens) if self.predict else None
        req = fleet.dispatch_request(
            wr.request_id, svc, wr.prompt_tokens, predicted, now, *fleet.prompt_of(wr)
        )
        if fleet.held_ahead(svc.model):
            return Route(svc, predicted, None, SATURATED)  # behind the requests already waiting
        try:
            iid = fleet.pick_instance(svc, req, frozenset(), late=True)
        except Saturated:
            return Route(svc, predicted, None, SATURATED)
        except NoCandidate as e:
            return Route(svc, predicted, None, str(e))
        return Route(svc, predicted, iid, None)

    def restrict(self, instance_ids: Iterable[str], routes: list[Route], sample_origin: float) -> None:
        """Become one part of a partitioned run (``llmfleet.sim.partition``): keep only these instances,
        take each arrival's route from ``routes`` (in arrival order) and sample on the whole run's clock."""
        self.fleet.restrict(instance_ids)
        self._routes = routes
        self._sample_origin = sample_origin

    def coupling(self) -> str | None:
        """What ties instances together beyond routing (so a run cannot be split), or None."""
        if self.central is not None:
            return "a central scheduler (scls_central) batches across instances"
        if self._on_finish is not None:
            return "the dispatch policy tracks completions (on_finish)"
        if self._hooks or self.events.one_shots:
            return "hooks (every, at) act across instances"
        if self.fleet.fleet_changes:
            return "the instance set changes (add_instance, set_models)"
        if self.events or self.records:
            return "the simulator has already run"
        return None

    def _record(self, wr, svc: SimService) -> RequestRecord:
        rec = RequestRecord(
            wr.request_id, svc.name, svc.model, wr.arrival_s, wr.prompt_tokens, wr.output_tokens,
            tenant=getattr(wr, "tenant", ""), priority=getattr(wr, "priority", None), adapter=svc.adapter,
        )  # fmt: skip
        if getattr(wr, "has_content", False):  # its prompt's token ids: the engines' prefix caching
            rec.content = wr
        self.records.append(rec)
        return rec

    def _arrival_hook(self, wr) -> Callable[[Any, float], None]:
        """A hook (:meth:`EventQueue.at`) that lets ``wr`` arrive when it runs."""
        return lambda _sim, now: self._arrive(wr, now)

    def _arrive(self, wr, now: float, route: Route | None = None) -> None:
        if self.central is not None:  # to the central pool: no dispatch at arrival
            svc = self.fleet.service(wr.service)
            rec = self._record(wr, svc)
            predicted = self.predict(svc.name, wr.prompt_tokens) if self.predict else None
            self.central.intake(rec, svc, predicted, now)
            return
        svc, predicted, iid, why = route or self.route(wr, now)
        rec = self._record(wr, svc)
        if iid is None:  # held for capacity (see llmfleet.sim.holds), or failed with the reason
            if not self.fleet.hold(rec, predicted, SATURATED if why == SATURATED else COLD):
                rec.failed = why or "no instance"
            return
        self.fleet.admit(rec, svc, iid, predicted, now)

    # ------------------------------------------------------------------------------------------ run
    def run(
        self,
        requests: Sequence,
        *,
        total: int | None = None,
        progress: Callable[[int, float], None] | None = None,
        strict_services: bool = False,
        stop: Callable[[RequestRecord], bool] | None = None,
    ) -> SimResult:
        """Simulate ``requests`` (arrival-ordered objects with request_id, arrival_s, prompt_tokens,
        output_tokens, service). With one service and ``strict_services`` False, every request goes
        to it whatever its label. ``progress(done, now)`` is called every ~1% of ``total``.

        ``stop(record)`` is asked at each request's completion; once it answers True the run ends at
        that step's end (``result.stopped_s``): no later event runs, and the requests still under way or
        not yet arrived have no record or an unfinished one (not failed). A search that only needs to
        know that a run misses its target stops at the miss that decides it."""
        t0 = time.perf_counter()
        self.fleet.use_services(strict_services)
        self._follow = FollowUps.of(requests, self._release)
        finished: FinishCallback | None = self._finished if self._follow is not None else self._on_finish
        stopped: list[float] = []
        if stop is not None:
            finished = self._stopping(finished, stop, stopped)
        it = iter(requests)
        first = next(it, None)
        if first is None:
            raise ValueError("the workload has no requests")
        self._start(first)
        samples: list[Sample] = []
        events = arrived = 0
        step = max(1, (total or 0) // 100)
        while self.events:
            t, kind, a, b = self.events.pop()
            events += 1
            if kind == ARRIVAL:
                self._read_next(it, a)
                if self._heartbeat_s and self._routes is None:  # placed at the next beat, in arrival
                    beat = max(t, self._heartbeat_s * math.ceil(t / self._heartbeat_s))  # order; TTFT from t
                    self.events.at(beat, self._arrival_hook(a))
                else:
                    self._arrive(a, t, None if self._routes is None else self._routes[arrived])
                arrived += 1
                if progress and arrived % step == 0:
                    progress(arrived, t)
            elif kind == SAMPLE:
                samples.append(self._sample(t))
                period = self.sample_period_s  # set: SAMPLE events run only with a period
                if period is not None and (self._pending or self._busy()):
                    self.events.push(t + period, SAMPLE)
            else:
                self._handle(kind, t, a, b, finished)
                if stopped:
                    break
        if progress:
            progress(arrived, self.now)
        if not stopped:
            self._close()
        fleet = self.fleet
        return SimResult(
            records=self.records,
            samples=samples,
            instances=[self.instance_stats(i) for i in fleet.instances.values()],
            end_s=self.now,
            events=events,
            wall_s=time.perf_counter() - t0,
            cost_sources=self.cost.sources(),
            provisioned_gpus=max(n for _, n in fleet.gpu_log),
            gpu_log=list(fleet.gpu_log),
            stopped_s=stopped[0] if stopped else None,
        )

    def _stopping(
        self,
        finished: FinishCallback | None,
        stop: Callable[[RequestRecord], bool],
        stopped: list[float],
    ) -> FinishCallback:
        """``finished`` (if any), then ``stop`` asked with the completed request's record; the time of
        its first True goes into ``stopped``."""
        unfinished = {r.request_id: r for r in self.records}
        seen = len(self.records)

        def on_finish(request_id: str, instance_id: str, output_tokens: int, now: float) -> None:
            nonlocal seen
            if finished is not None:
                finished(request_id, instance_id, output_tokens, now)
            if len(self.records) > seen:  # the records made since the last completion
                unfinished.update((r.request_id, r) for r in self.records[seen:])
                seen = len(self.records)
            if not stopped and stop(unfinished.pop(request_id)):
                stopped.append(now)

        return on_finish

    def _start(self, first) -> None:
        """The first arrival, the hooks' first ticks and the first sample."""
        self.events.push(first.arrival_s, ARRIVAL, first)
        self._pending = True
        for i, (period, _) in enumerate(self._hooks):
            self.events.push(first.arrival_s + period, HOOK, i)
        if self.sample_period_s is not None:
            origin = self._sample_origin
            self.events.push(first.arrival_s if origin is None else origin, SAMPLE)

    def _read_next(self, it: Iterator, current) -> None:
        """Read the arrival after ``current`` (arrivals are read one ahead; turns that follow another
        request wait for it in ``_follow``)."""
        nxt = next(it, None)
        while nxt is not None and self._follow is not None and nxt.follows:
            self._follow.read(nxt)
            nxt = next(it, None)
        if nxt is None:
            self._pending = False
            return
        if nxt.arrival_s < current.arrival_s:
            raise ValueError(
                f"requests must be sorted by arrival: {nxt.request_id} ({nxt.arrival_s}) comes "
                f"after {current.request_id} ({current.arrival_s})"
            )
        self.events.push(nxt.arrival_s, ARRIVAL, nxt)

    def _handle(self, kind: int, t: float, a: Any, b: Any, finished: FinishCallback | None) -> None:
        """A step end (``finished`` hears of each request it completes), a move's landing, a hook or a
        model load."""
        if kind == END:
            self.fleet.step_ended(a, b, t, finished)
        elif kind == MOVE:
            self.fleet.land(a, b, t)
        elif kind == HOOK:
            if a is None:  # once (at)
                b(self, t)
                return
            period, fn = self._hooks[a]
            fn(self, t)
            if self._pending or self._busy():
                self.events.push(t + period, HOOK, a)
        elif kind == READY:
            self.fleet.ready(a, b, t)

    def _finished(self, request_id: str, instance_id: str, output_tokens: int, now: float) -> None:
        """A request completed: the dispatcher hears of it, and the turns that follow it are released."""
        if self._on_finish is not None:
            self._on_finish(request_id, instance_id, output_tokens, now)
        assert self._follow is not None  # the listener of closed-loop runs
        self._follow.ended(request_id, now)

    def _release(self, turn) -> None:
        """Schedule a released turn's arrival at its ``arrival_s`` (a heartbeat dispatcher places it at
        the next beat, as any arrival)."""
        t = turn.arrival_s
        if self._heartbeat_s:
            t = max(t, self._heartbeat_s * math.ceil(t / self._heartbeat_s))
        self.events.at(t, lambda _sim, now: self._arrive_turn(turn, now))

    def _arrive_turn(self, turn, now: float) -> None:
        assert self._follow is not None
        self._follow.arrived()
        self._arrive(turn, now)

    def _close(self) -> None:
        """Requests left at the end fail (none should be: each line says why it cannot happen)."""
        self.fleet.fail_held("the simulation ended first")  # a load under way always ends in a READY event
        for turn in self._follow.stranded() if self._follow is not None else ():
            self._record(turn, self.fleet.service(turn.service)).failed = PREDECESSOR_FAILED
        stranded = [r for r in self.records if not r.done and not r.failed]
        for rec in stranded:  # cannot happen unless a policy never schedules a runnable request
            rec.failed = "never scheduled (the request policy left it waiting with the instance idle)"

    @property
    def pending_arrivals(self) -> bool:
        """Arrivals not yet read from the workload (during :meth:`run`)."""
        return self._pending

    @property
    def finished(self) -> bool:
        """No arrival left to read and nothing that will produce an event (hooks stop rescheduling)."""
        return not self._pending and not self._busy()

    def _busy(self) -> bool:
        """Work that will produce events: a batch in flight, a move or a model load under way."""
        if self.central is not None and self.central.busy:
            return True
        if self._follow is not None and self._follow.in_think:  # a released turn is yet to arrive
            return True
        return self.fleet.busy()

    def _sample(self, t: float) -> Sample:
        used = cap = active = inside = active_cap = mem_used = mem_cap = 0
        kinds: dict[tuple[tuple[str, ...], int], list[int]] = {}  # (models, tp) -> [KV used, C]
        for inst in self.fleet.instances.values():
            if not inst.active:
                continue
            u, c = inst.kv_used_bytes, inst.kv_capacity_bytes
            used += u
            cap += c
            q = inst.queued
            inside += q
            if q:
                active += inst.tp
                active_cap += c
                mem_used += u + sum(inst.archs[m].weight_bytes for m in inst.models)
                mem_cap += inst.tp * inst.hw.mem_bytes
            k = kinds.setdefault((tuple(inst.models), inst.tp), [0, c])
            k[0] += u
            k[1] = max(k[1], c)
        kv = tuple((m, tp, u, c) for (m, tp), (u, c) in sorted(kinds.items()) if u)
        return Sample(t, used, cap, active, inside, active_cap, kv, mem_used, mem_cap)

    @staticmethod
    def instance_stats(inst: SimInstance) -> dict:
        return {
            "instance": inst.instance_id,
            "models": list(inst.models),
            "tp": inst.tp,
            "iterations": inst.iterations,
            "busy_s": inst.busy_s,
            "preemptions": inst.preemptions,
            "kv_blocks": inst.alloc.num_blocks,
            "block_bytes": inst.layout.block_bytes,
            "started_s": inst.started_s,
            "released_s": inst.released_s,
            "static_batches": inst.static_batches,
            "early_returns": inst.early_returns,
            "requeues": inst.core.requeues,
            "prefix_queries": inst.core.prefix_queries,  # prompt tokens looked up in the prefix cache
            "prefix_hits": inst.core.prefix_hits,  # of them, found cached (not computed)
            "adapter_loads": inst.adapter_loads,  # LoRA adapters put in a slot (misses)
            "adapter_evictions": inst.adapter_evictions,
        }
