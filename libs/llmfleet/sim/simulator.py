"""The discrete-event cluster simulator.

Events (a heap ordered by time, then insertion): request arrivals (read lazily from the workload, so a
million requests cost one pending event), ends of engine iterations (or chunks), periodic hooks and
request moves. At an arrival the **dispatch policy object** (``policies/dispatch``) picks an instance
among those hosting the service's model, from :class:`~llmfleet.policies.dispatch.EngineCandidate`
load views kept current per instance; each instance runs its own **request policy object**
(``policies/request`` or ``policies/batching``) exactly as the live engine does
(:mod:`llmfleet.sim.instance`).

Hooks for the controllers that act later: ``every(period_s, fn)`` calls ``fn(sim, now)`` each period
(epoch ticks for placement/migration), ``at(t, fn)`` once at ``t``, ``move_request(request_id,
instance_id, transfer_s, now)`` moves a request (its KV if it has any) to another instance, arriving
after ``transfer_s`` and joining at the destination's next step boundary; ``add_instance``,
``set_models`` and ``retire_instance`` change the instance set (:mod:`llmfleet.sim.fleet`). A dispatch policy with ``on_finish(request_id, engine_id, output_tokens,
now)`` hears of every completion (as in the live scheduler).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
from llmfleet.costmodel import Hardware, ModelArch
from llmfleet.engine_core import CoreRequest
from llmfleet.policies.dispatch import (
    CountsInfeasible,
    DispatchPolicy,
    DispatchRequest,
    EngineCandidate,
    FinishListener,
    HostList,
    NoCandidate,
    RequestProgress,
)
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.sim.cost import CostBook
from llmfleet.sim.events import ARRIVAL as _ARRIVAL
from llmfleet.sim.events import END as _END
from llmfleet.sim.events import HOOK as _HOOK
from llmfleet.sim.events import MOVE as _MOVE
from llmfleet.sim.events import READY as _READY
from llmfleet.sim.events import SAMPLE as _SAMPLE
from llmfleet.sim.fleet import COLD, SATURATED, Fleet, Saturated
from llmfleet.sim.instance import SimInstance, record_of
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.spec import SimService, SimSpec

Predict = Callable[[str, int], float]  # (service, prompt_tokens) -> predicted output tokens


class Route(NamedTuple):
    """Where an arriving request goes: its service, predicted output length, and instance (None, with
    the reason in ``failed``, when no instance can take it)."""

    service: SimService
    predicted: float | None
    instance_id: str | None
    failed: str | None


class CentralScheduler(Protocol):
    """A central scheduler (``llmfleet.sim.scls_central``): it takes every arrival into its pool and hands an
    idle instance its next batch."""

    @property
    def busy(self) -> bool: ...

    def intake(
        self, sim: Simulator, rec: RequestRecord, svc: SimService, predicted: float | None, now: float
    ) -> None: ...

    def on_idle(self, sim: Simulator, inst: SimInstance, now: float) -> None: ...


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


class Simulator(Fleet):
    def __init__(
        self,
        spec: SimSpec,
        plan: Sequence[InstancePlan],
        make_policy: Callable[[], object],
        dispatch: DispatchPolicy,
        cost: CostBook,
        *,
        fast_forward: bool = True,
        sample_period_s: float | None = None,
        predict: Predict | None = None,
    ) -> None:
        if not plan:
            raise ValueError("the placement plan has no instances")
        used = sum(p.tp for p in plan)
        if used > spec.cluster.count:
            raise ValueError(f"the plan uses {used} GPUs but the cluster has {spec.cluster.count}")
        self.spec = spec
        limits = spec.engine.limits
        self._batch_cap = min(limits.max_running, limits.max_batch_requests)  # what runs at once
        self.cost = cost
        self.dispatch = dispatch
        # a dispatcher reading per-request progress (Aladdin's constraint (d)) sees every busy instance
        # as of the dispatch time: tokens of the chunk in flight count up to ``now``
        self._progress = dispatch.needs.reads_progress
        self.now = 0.0
        self.predict = predict
        self.sample_period_s = sample_period_s
        self._archs: dict[str, ModelArch] = spec.archs()
        self._make_policy = make_policy
        # KV-aware dispatchers read kv_used, which a chunk only updates at its end: no chunks then.
        self._fast_forward = fast_forward and not dispatch.needs.reads_kv
        self.instances: dict[str, SimInstance] = {}
        for p in plan:
            if p.instance_id in self.instances:
                raise ValueError(f"instance id {p.instance_id!r} appears twice in the plan")
            self.instances[p.instance_id] = self._new_instance(p)
        self._cands: dict[str, HostList] = {}
        self._slot: dict[str, list[tuple[str, int]]] = {}  # instance -> [(model, index in _cands[model])]
        self._rebuild_cands()
        self._dirty: set[str] = set()
        self._heap: list[tuple] = []
        self._seq = 0
        self._where: dict[str, SimInstance] = {}
        self._hooks: list[tuple[float, Callable[[Simulator, float], None]]] = []
        # dispatchers that track what they placed (Aladdin, SCLS max-min) hear about completions
        self._on_finish = dispatch.on_finish if isinstance(dispatch, FinishListener) else None
        # a dispatcher that never reads load (round robin) needs no candidate refresh, and its choices do
        # not depend on the instances' state: a run can then be partitioned across processes
        self.load_blind = dispatch.needs.state_blind
        self._routes: list[Route] | None = None  # set in a partition: each arrival's route, decided upfront
        self._sample_origin: float | None = None  # set in a partition: the whole run's first arrival
        self.records: list[RequestRecord] = []
        self._moving = 0
        self._reprefill: set[str] = set()  # moving requests whose KV stays behind (token transfer)
        self._svc_cache: dict[str, SimService] = {}
        self.strict_services = False
        self.now = 0.0
        self._pending = False  # arrivals not yet read (during run)
        self._kv_bytes_per_token = {m: a.kv_bytes_per_token for m, a in self._archs.items()}
        # per model: arrivals a dispatcher counting ``infeasible`` (Aladdin best fit) found no worker for
        self.infeasible: dict[str, int] = {}
        self._counting = dispatch if isinstance(dispatch, CountsInfeasible) else None  # checked once
        # central scheduling (llmfleet.sim.scls_central): arrivals go to its pool, idle instances ask it
        self.central: CentralScheduler | None = None
        self._init_fleet()

    # ------------------------------------------------------------------------------------- plumbing
    def _push(self, t: float, kind: int, a: object = None, b: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, a, b))

    def _new_instance(self, p: InstancePlan) -> SimInstance:
        missing = [m for m in p.models if m not in self._archs]
        if missing:
            raise ValueError(f"instance {p.instance_id} hosts {missing}, which no service uses")
        hw: Hardware = self.spec.cluster.hw
        return SimInstance(
            p.instance_id, p.models, p.tp, hw, self._archs, self.spec.engine, self.cost, self._make_policy(),
            fast_forward=self._fast_forward,
        )  # fmt: skip

    def _candidate(self, inst: SimInstance) -> EngineCandidate:
        queued = 0
        if self.dispatch.needs.reads_kv:  # queued prompts as promised KV: a scan only KV readers pay for
            block, tpb = inst.layout.block_bytes, inst.tpb
            queued = (
                sum(-(-r.sched.prompt_tokens // tpb[r.sched.model]) for r in inst.waiting.values()) * block
            )
        return EngineCandidate(
            inst.instance_id, inst.serving, len(inst.running), len(inst.waiting),
            inst.kv_used_bytes, inst.kv_capacity_bytes, queued,
            self._progress_of(inst, self.now) if self._progress else None,
            self._batch_cap,
        )  # fmt: skip

    @staticmethod
    def _progress_of(inst: SimInstance, now: float) -> tuple[RequestProgress, ...]:
        """The requests that have produced their first token on ``inst``, with their tokens by ``now``
        (what a live engine would have streamed): those finished at the last step boundary plus, for
        members of a chunk in flight, its iterations that ended by ``now``."""
        w = inst.work
        done, members = 0, ()
        if w is not None and not w.plan.static:
            k = w.plan.iterations
            if w.ends is not None:
                done = int(np.searchsorted(w.ends[:k], now, side="right"))
            elif w.end <= now:
                done = 1
            if done:
                members = {id(r) for r in w.plan.members}
        out = []
        for r in inst.core.requests.values():
            rec = r.payload
            f = rec.first_token_s
            if f is None:
                continue  # no token yet: a pending prefill, not an ongoing request
            n = rec.produced + (done if id(r) in members else 0)
            out.append(RequestProgress(rec.request_id, rec.model, n, f))
        return tuple(out)

    def candidates(self) -> list[EngineCandidate]:
        """Every serving instance as a dispatcher sees it now (one candidate each)."""
        return [self._candidate(i) for _, i in sorted(self.instances.items()) if i.serving and i.active]

    def _refresh(self) -> None:
        for iid in self._dirty:
            slots = self._slot.get(iid)
            if slots:
                c = self._candidate(self.instances[iid])
                for m, i in slots:
                    self._cands[m][i] = c
        self._dirty.clear()

    def _fail(self, r: CoreRequest, why: str) -> None:
        rec = record_of(r)
        rec.failed = why
        self._where.pop(rec.request_id, None)

    def _kick(self, inst: SimInstance, now: float) -> None:
        if not self.load_blind:
            self._dirty.add(inst.instance_id)
        if inst.work is None:
            if inst.outbound:
                self._flush_outbound(inst, now)
            if inst.landing and inst.core.static_batch is None:
                for r in inst.landing:
                    self._join(r, inst, now)
                inst.landing.clear()
            if inst.pending and inst.core.static_batch is None:
                self._settle(inst, now)
                if inst.released_s is not None:
                    return
            if self.central is not None and inst.core.static_batch is None:
                self.central.on_idle(self, inst, now)
            end = inst.start(now, self._fail)
            if end is None and inst.pending and inst.core.static_batch is None:
                self._settle(inst, now)  # idle now (its last requests may have failed): unload, release
                return
            if end is not None:
                self._push(end, _END, inst.instance_id, inst.version)
        else:
            end = inst.interrupt(now)
            if end is not None:
                self._push(end, _END, inst.instance_id, inst.version)

    # ---------------------------------------------------------------------------------------- hooks
    def every(self, period_s: float, fn: Callable[[Simulator, float], None]) -> None:
        """Call ``fn(sim, now)`` every ``period_s`` simulated seconds while requests remain."""
        if period_s <= 0:
            raise ValueError(f"hook period must be > 0, got {period_s}")
        self._hooks.append((period_s, fn))

    def instance_of(self, request_id: str) -> str | None:
        inst = self._where.get(request_id)
        return inst.instance_id if inst else None

    def move_request(
        self, request_id: str, instance_id: str, transfer_s: float, now: float, *, reprefill: bool = False
    ) -> bool:
        """Move a queued or running request to ``instance_id``; it arrives after ``transfer_s`` with
        its KV, joining between two steps there (or re-prefills if the KV does not fit).
        ``reprefill``: only its tokens travel (Mell's token transfer); it re-prefills prompt + output
        at the destination. A member of the step in flight leaves when that step ends (the step is cut
        to its current iteration), as a live engine pauses a request between steps to export it; it
        does not leave if it finishes in that step. False when it cannot move (unknown, already
        leaving, or the destination does not serve its model)."""
        src = self._where.get(request_id)
        dst = self.instances.get(instance_id)
        if src is None or dst is None or src is dst or transfer_s < 0 or request_id in src.outbound:
            return False
        r = src.core.requests.get(request_id)
        if r is None or r.sched.model not in dst.tpb:
            return False  # not here, or the destination cannot host it
        if src.core.in_flight(request_id):
            src.outbound[request_id] = (instance_id, transfer_s, reprefill)
            self._kick(src, now)  # cut a fast-forwarded chunk to the iteration in progress
            return True
        self._detach(r, src, dst, transfer_s, now, reprefill)
        self._kick(src, now)
        return True

    def _detach(
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
            return False
        record_of(r).moves += 1
        if reprefill:
            self._reprefill.add(request_id)
        self._where[request_id] = dst
        self._moving += 1
        dst.inbound[r.sched.model] = dst.inbound.get(r.sched.model, 0) + 1
        self._push(now + transfer_s, _MOVE, r, dst)
        return True

    def _flush_outbound(self, inst: SimInstance, now: float) -> None:
        """Moves asked for while their request was in the step that just ended."""
        moves = list(inst.outbound.items())
        inst.outbound.clear()
        for rid, (dst_id, transfer_s, reprefill) in moves:
            r = inst.core.requests.get(rid)
            dst = self.instances.get(dst_id)
            if r is None or dst is None or self._where.get(rid) is not inst or r.sched.model not in dst.tpb:
                continue  # finished (or failed) in that step, or the destination changed
            self._detach(r, inst, dst, transfer_s, now, reprefill)

    def _land(self, r: CoreRequest, dst: SimInstance, now: float) -> None:
        """The moved request arrives with its KV and joins ``dst`` at its next step boundary
        (``EngineCore.land``: it re-prefills prompt + output when the KV does not fit there)."""
        if not self._land_guard(r, dst):  # its model left dst meanwhile: re-prefill where it is served
            rec = record_of(r)
            self._where.pop(rec.request_id, None)
            svc = self._service(rec.service)
            req = DispatchRequest(rec.request_id, rec.model, svc.name, rec.prompt_tokens,
                                  r.sched.predicted_output_tokens or 0.0, self._kv_bytes_per_token[rec.model], now)  # fmt: skip
            try:
                dst = self.instances[self._dispatch(svc, req, frozenset())]
            except NoCandidate as e:
                rec.failed = f"moved off an instance that unloaded its model, and {e}"
                return
            self._where[rec.request_id] = dst
            dst.core.land(r, now)
            rec.instance = dst.instance_id
            self._kick(dst, now)
            return
        if dst.work is not None or dst.core.static_batch is not None:
            dst.landing.append(r)  # it joins between steps (static: batches), where the free KV is exact
        else:
            self._join(r, dst, now)
        self._kick(dst, now)

    def _join(self, r: CoreRequest, dst: SimInstance, now: float) -> None:
        reprefill = r.request_id in self._reprefill
        if reprefill:
            self._reprefill.discard(r.request_id)
        kv = r.kv_tokens if r.sched.phase == "decode" and not reprefill else 0
        dst.core.land(r, now, kv_tokens=kv)
        record_of(r).instance = dst.instance_id

    # ------------------------------------------------------------------------------------- dispatch
    def route(self, wr, now: float) -> Route:
        """Predict and dispatch one arriving request: its service, prediction, and instance id (or why
        no instance can take it)."""
        svc = self._service(wr.service)
        predicted = self.predict(svc.name, wr.prompt_tokens) if self.predict else None
        req = DispatchRequest(
            wr.request_id, svc.model, svc.name, wr.prompt_tokens, predicted or 0.0,
            self._kv_bytes_per_token[svc.model], now,
        )  # fmt: skip
        if self.binding == "late" and self._held_ahead(svc.model):
            return Route(svc, predicted, None, SATURATED)  # behind the requests already waiting
        try:
            iid = self._dispatch(svc, req, frozenset(), late=True)
        except Saturated:
            return Route(svc, predicted, None, SATURATED)
        except NoCandidate as e:
            return Route(svc, predicted, None, str(e))
        return Route(svc, predicted, iid, None)

    def _dispatch(
        self, svc: SimService, req: DispatchRequest, exclude: frozenset[str], *, late: bool = False
    ) -> str:
        """The dispatch policy's choice among the instances serving ``svc``'s model (NoCandidate if none).
        ``late``: an arrival under late binding, only among instances with room (Saturated if none)."""
        if self._progress:  # progress moves with time on every busy instance
            self._dirty.update(i for i, inst in self.instances.items() if inst.work is not None)
        if not self.load_blind:
            self._refresh()
        counting = self._counting
        before = counting.infeasible if counting is not None else 0
        cands = self._cands.get(svc.model, ())
        if late:
            cands = self._room(svc.model) or cands
        iid = self.dispatch.choose(svc.model, cands, exclude, request=req)
        if counting is not None and counting.infeasible != before:
            self.infeasible[svc.model] = self.infeasible.get(svc.model, 0) + 1
        return iid

    def restrict(self, instance_ids: Iterable[str], routes: list[Route], sample_origin: float) -> None:
        """Become one part of a partitioned run (``llmfleet.sim.partition``): keep only these instances,
        take each arrival's route from ``routes`` (in arrival order) and sample on the whole run's clock."""
        keep = set(instance_ids)
        self.instances = {i: inst for i, inst in self.instances.items() if i in keep}
        self._routes = routes
        self._sample_origin = sample_origin

    def coupling(self) -> str | None:
        """What ties instances together beyond routing (so a run cannot be split), or None."""
        if self.central is not None:
            return "a central scheduler (scls_central) batches across instances"
        if self._on_finish is not None:
            return "the dispatch policy tracks completions (on_finish)"
        if self._hooks or self._one_shots:
            return "hooks (every, at) act across instances"
        if self.fleet_changes:
            return "the instance set changes (add_instance, set_models)"
        if self._heap or self.records:
            return "the simulator has already run"
        return None

    def _arrive(self, wr, now: float, route: Route | None = None) -> None:
        if self.central is not None:  # to the central pool: no dispatch at arrival
            svc = self._service(wr.service)
            rec = RequestRecord(
                wr.request_id, svc.name, svc.model, wr.arrival_s, wr.prompt_tokens, wr.output_tokens
            )
            self.records.append(rec)
            predicted = self.predict(svc.name, wr.prompt_tokens) if self.predict else None
            self.central.intake(self, rec, svc, predicted, now)
            return
        svc, predicted, iid, why = route or self.route(wr, now)
        rec = RequestRecord(
            wr.request_id, svc.name, svc.model, wr.arrival_s, wr.prompt_tokens, wr.output_tokens
        )
        self.records.append(rec)
        if iid is None:  # held for capacity (see llmfleet.sim.fleet), or failed with the reason
            if not self._hold(rec, predicted, SATURATED if why == SATURATED else COLD):
                rec.failed = why or "no instance"
            return
        self._admit(rec, svc, iid, predicted, now)

    def _admit(
        self, rec: RequestRecord, svc: SimService, iid: str, predicted: float | None, now: float
    ) -> None:
        """Hand an arrived request to instance ``iid`` at ``now``."""
        inst = self.instances[iid]
        rec.instance = iid
        rec.solo_s = self.cost.solo_time(svc.model, inst.tp, rec.prompt_tokens, rec.output_tokens)
        deadline = rec.arrival_s + svc.deadline_s if svc.deadline_s is not None else None
        inst.admit(rec, svc.max_tokens, now, predicted, deadline)
        self._where[rec.request_id] = inst
        self._kick(inst, now)

    def _service(self, name: str) -> SimService:
        svc = self._svc_cache.get(name)
        if svc is None:
            if len(self.spec.services) == 1 and not self.strict_services:
                svc = self.spec.services[0]
            else:
                svc = self.spec.service(name)  # KeyError names the known services
            self._svc_cache[name] = svc
        return svc

    # ------------------------------------------------------------------------------------------ run
    def run(
        self,
        requests: Iterable,
        *,
        total: int | None = None,
        progress: Callable[[int, float], None] | None = None,
        strict_services: bool = False,
    ) -> SimResult:
        """Simulate ``requests`` (arrival-ordered objects with request_id, arrival_s, prompt_tokens,
        output_tokens, service). With one service and ``strict_services`` False, every request goes
        to it whatever its label. ``progress(done, now)`` is called every ~1% of ``total``."""
        t0 = time.perf_counter()
        self._svc_cache.clear()
        self.strict_services = strict_services
        it = iter(requests)
        first = next(it, None)
        if first is None:
            raise ValueError("the workload has no requests")
        self._push(first.arrival_s, _ARRIVAL, first)
        self._pending = True
        for i, (period, _) in enumerate(self._hooks):
            self._push(first.arrival_s + period, _HOOK, i)
        span = self.sample_period_s
        if span is not None:
            self._push(first.arrival_s if self._sample_origin is None else self._sample_origin, _SAMPLE)
        samples: list[Sample] = []
        events = arrived = 0
        step = max(1, (total or 0) // 100)
        pending = True  # arrivals not yet read
        while self._heap:
            t, kind, _, a, b = heapq.heappop(self._heap)
            if t < self.now - 1e-9:
                raise RuntimeError(f"event at {t} before now {self.now}: time went backwards")
            self.now = t
            events += 1
            if kind == _END:
                inst = self.instances[a]
                if b != inst.version or inst.work is None:
                    continue  # superseded by a truncated chunk
                for r in inst.finish_work(t):
                    self._where.pop(r.sched.request_id, None)
                    if self._on_finish is not None:
                        self._on_finish(r.sched.request_id, inst.instance_id, record_of(r).output_tokens, t)
                self._kick(inst, t)
                if self._held:  # late binding: a step end may have made room
                    for m in inst.serving:
                        if m in self._held:
                            self._serve_held(m, t)
            elif kind == _ARRIVAL:
                nxt = next(it, None)
                if nxt is not None:
                    if nxt.arrival_s < a.arrival_s:
                        raise ValueError(
                            f"requests must be sorted by arrival: {nxt.request_id} ({nxt.arrival_s}) comes "
                            f"after {a.request_id} ({a.arrival_s})"
                        )
                    self._push(nxt.arrival_s, _ARRIVAL, nxt)
                else:
                    pending = self._pending = False
                self._arrive(a, t, None if self._routes is None else self._routes[arrived])
                arrived += 1
                if progress and arrived % step == 0:
                    progress(arrived, t)
            elif kind == _MOVE:
                self._moving -= 1
                self._land(a, b, t)
            elif kind == _HOOK:
                if a is None:  # once (at)
                    b(self, t)
                    continue
                period, fn = self._hooks[a]
                fn(self, t)
                if pending or self._busy():
                    self._push(t + period, _HOOK, a)
            elif kind == _READY:
                self._ready(a, b, t)
            elif kind == _SAMPLE:
                samples.append(self._sample(t))
                if pending or self._busy():
                    self._push(t + span, _SAMPLE)
        if progress:
            progress(arrived, self.now)
        for model in list(self._held):  # cannot happen: a load under way always ends in a READY event
            self._fail_held(model, "the simulation ended first")
        stranded = [r for r in self.records if not r.done and not r.failed]
        for rec in stranded:  # cannot happen unless a policy never schedules a runnable request
            rec.failed = "never scheduled (the request policy left it waiting with the instance idle)"
        return SimResult(
            records=self.records,
            samples=samples,
            instances=[self.instance_stats(i) for i in self.instances.values()],
            end_s=self.now,
            events=events,
            wall_s=time.perf_counter() - t0,
            cost_sources=self.cost.sources(),
            provisioned_gpus=max(n for _, n in self.gpu_log),
            gpu_log=list(self.gpu_log),
        )

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
        return self._moving > 0 or any(i.work is not None or i.loading for i in self.instances.values())

    def _sample(self, t: float) -> Sample:
        used = cap = active = inside = active_cap = mem_used = mem_cap = 0
        kinds: dict[tuple[tuple[str, ...], int], list[int]] = {}  # (models, tp) -> [KV used, C]
        for inst in self.instances.values():
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
        }
