"""The simulated fleet: the instances over time and the requests on them, a component the
:class:`~llmfleet.sim.simulator.Simulator` holds (``sim.fleet``) and its controllers call.

Its public API:

* **where things are** — ``hosts`` (the instances serving a model), ``serves``, ``locate`` /
  ``instance_of`` (a request's instance), ``candidates`` (what a dispatcher sees), ``hosting``,
  ``gpus_used``, ``gpus_free``, ``held``; ``service`` looks up a request's service;
* **requests** — ``pick_instance`` (the dispatch policy's choice), ``admit`` (hand a request to an
  instance), ``hold`` (wait for capacity, :mod:`llmfleet.sim.holds`), ``track`` / ``release`` (for drivers
  that admit requests themselves), ``move_request`` (:mod:`llmfleet.sim.moves`); ``kick`` runs an
  instance's next step;
* **changes** — placement changes inside a simulation (by :class:`llmfleet.sim.replan.PlacementLoop`, or
  by hand through the hooks): ``add_instance``, ``set_models``, ``retire_instance``, and ``ready`` (a
  model's weights loaded), in :mod:`llmfleet.sim.fleet_changes`; ``gpus_used``, ``gpu_log`` and
  ``fleet_changes`` count them.

``binding``, ``saturation``, ``cold_start``, ``wake`` say when arrivals wait (:mod:`llmfleet.sim.holds`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from llmfleet.costmodel import ModelArch
from llmfleet.costmodel.memory import load_seconds
from llmfleet.engine_core import CoreRequest
from llmfleet.engine_core.core import DEFAULT_PREEMPTION
from llmfleet.policies.batching import StaticBatchPolicy
from llmfleet.policies.capacity import Saturation
from llmfleet.policies.capacity.priority import request_priority
from llmfleet.policies.dispatch import CountsInfeasible, DispatchPolicy, DispatchRequest, EngineCandidate
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import RequestPolicy
from llmfleet.policies.request.preemption import PreemptionRule
from llmfleet.sim.candidates import CandidateBook
from llmfleet.sim.cost import CostBook
from llmfleet.sim.events import END, EventQueue
from llmfleet.sim.fleet_changes import FleetChanges
from llmfleet.sim.holds import COLD, Holds
from llmfleet.sim.instance import SimInstance, record_of
from llmfleet.sim.memory import pool_layout
from llmfleet.sim.moves import Moves
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.spec import SimService, SimSpec
from llmfleet.spec.defaults import BINDINGS, FAIRNESS, Binding, Fairness
from llmfleet.workload.prompts import prompt_text
from llmfleet.workload.request import WorkloadRequest


class Fleet:
    """The instances of a simulation and the requests on them; see the module docstring for its API."""

    def __init__(
        self,
        spec: SimSpec,
        *,
        plan: Sequence[InstancePlan],
        events: EventQueue,
        make_policy: Callable[[], RequestPolicy | StaticBatchPolicy],
        dispatch: DispatchPolicy,
        cost: CostBook,
        fast_forward: bool = True,
        preemption: PreemptionRule | None = DEFAULT_PREEMPTION,
    ) -> None:
        if not plan:
            raise ValueError("the placement plan has no instances")
        used = sum(p.tp for p in plan)
        if used > spec.cluster.count:
            raise ValueError(f"the plan uses {used} GPUs but the cluster has {spec.cluster.count}")
        self.spec, self.cost, self.dispatch, self.events = spec, cost, dispatch, events
        self.archs: dict[str, ModelArch] = spec.archs()
        self.kv_bytes_per_token = {m: a.kv_bytes_per_token for m, a in self.archs.items()}
        self.reference_tp = spec.reference_tps()  # solo times (normalized latency) at this TP per model
        self._make_policy = make_policy
        self.preemption = preemption  # every instance's core's rule, and late binding's (llmfleet.sim.holds)
        # KV-aware dispatchers read kv_used, which a chunk only updates at its end: no chunks then.
        self._fast_forward = fast_forward and not dispatch.needs.reads_kv
        self.instances: dict[str, SimInstance] = {}
        for p in plan:
            if p.instance_id in self.instances:
                raise ValueError(f"instance id {p.instance_id!r} appears twice in the plan")
            self.instances[p.instance_id] = self.new_instance(p)
        limits = spec.engine.limits
        adapters = spec.adapters
        if adapters and not spec.engine.max_loras:
            raise ValueError(
                f"services name LoRA adapters of {sorted(adapters)}, but the engines have no adapter slots "
                "(set the engine's max_loras)"
            )
        self.book = CandidateBook(
            dispatch.needs, min(limits.max_running, limits.max_batch_requests), events, adapters
        )
        self.book.rebuild(self.instances)
        # a dispatcher that never reads load (round robin) needs no candidate refresh, and its choices do
        # not depend on the instances' state: a run can then be partitioned across processes
        self.load_blind = dispatch.needs.state_blind
        self.reads_prompt = dispatch.needs.reads_prompt  # arrivals then carry their prompt's text
        self._counting = dispatch if isinstance(dispatch, CountsInfeasible) else None  # checked once
        # per model: arrivals a dispatcher counting ``infeasible`` (Aladdin best fit) found no worker for
        self.infeasible: dict[str, int] = {}
        self._where: dict[str, SimInstance] = {}
        self._svc_cache: dict[str, SimService] = {}
        self.strict_services = False
        hw, count = spec.cluster.hw, spec.cluster.count
        # instances are not mapped to nodes: a multi-node cluster moves KV over the network
        self.kv_link_bytes_per_s = hw.intra_node_bw if count <= hw.gpus_per_node else hw.inter_node_bw
        # requests wait for capacity (llmfleet.sim.holds): late binding, and the placement loop's wake-up
        # for a model no instance serves or a queue starting (set by llmfleet.sim.replan.PlacementLoop)
        self.binding: Binding = "early"
        self.saturation = Saturation()
        self.cold_start = True
        self.fairness: Fairness = FAIRNESS  # the order of held arrivals within a priority
        self.wake: Callable[[float], None] | None = None
        # a central scheduler (llmfleet.sim.scls_central) hands an idle instance its next batch
        self.on_idle: Callable[[SimInstance, float], None] | None = None
        self.moves = Moves(self, events)
        self.holds = Holds(self)
        self.changes = FleetChanges(self, self.book, self.holds, self.moves)

    def new_instance(self, p: InstancePlan) -> SimInstance:
        """An instance of ``p`` (its models' KV pool sized, holding no requests)."""
        missing = [m for m in p.models if m not in self.archs]
        if missing:
            raise ValueError(f"instance {p.instance_id} hosts {missing}, which no service uses")
        return SimInstance(
            p.instance_id, p.models, p.tp, self.spec.cluster.hw, self.archs, self.spec.engine, self.cost,
            self._make_policy(), fast_forward=self._fast_forward, preemption=self.preemption,
        )  # fmt: skip

    # ---------------------------------------------------------------------------------- where things are
    def hosts(self, model: str) -> list[SimInstance]:
        """The active instances serving ``model`` now, in instance order."""
        return [i for i in self.instances.values() if model in i.serving and i.active]

    def serves(self, model: str) -> bool:
        """Some instance takes ``model``'s requests (a dispatch candidate)."""
        return bool(self.book.by_model.get(model))

    def locate(self, request_id: str) -> SimInstance | None:
        """The instance a request is on (or moving to), None when it is on none."""
        return self._where.get(request_id)

    def instance_of(self, request_id: str) -> str | None:
        inst = self._where.get(request_id)
        return inst.instance_id if inst else None

    def candidates(self) -> list[EngineCandidate]:
        """Every serving instance as a dispatcher sees it now (one candidate each)."""
        return [self.book.candidate(i) for _, i in sorted(self.instances.items()) if i.serving and i.active]

    def service(self, name: str) -> SimService:
        """A request's service (with one service and ``strict_services`` off, every label is it)."""
        svc = self._svc_cache.get(name)
        if svc is None:
            if len(self.spec.services) == 1 and not self.strict_services:
                svc = self.spec.services[0]
            else:
                svc = self.spec.service(name)  # KeyError names the known services
            self._svc_cache[name] = svc
        return svc

    def use_services(self, strict: bool) -> None:
        """Resolve services anew, strictly by name or not (at the start of a run)."""
        self._svc_cache.clear()
        self.strict_services = strict

    def load_time_s(self, models: Sequence[str], tp: int) -> float:
        """Seconds to load ``models``' weights onto a ``tp``-GPU instance (``costmodel.memory.load_seconds``)."""
        return load_seconds([self.archs[m] for m in models], self.spec.cluster.hw, tp)

    def kv_transfer_s(self, model: str, tokens: int) -> float:
        """Seconds to move ``tokens`` of ``model``'s KV between instances."""
        return tokens * self.kv_bytes_per_token[model] / self.kv_link_bytes_per_s

    @property
    def gpus_free(self) -> int:
        return self.changes.gpus_free

    def hosting(self) -> dict[str, tuple[int, tuple[str, ...]]]:
        """instance id -> (tp, the models it will host once the changes under way are done), for every
        instance not given back (waiting for GPUs included)."""
        return {iid: (i.tp, i.target) for iid, i in self.instances.items() if i.released_s is None}

    def check_models(self, models: Sequence[str], tp: int, what: str) -> tuple[str, ...]:
        """``models`` without repeats; ValueError unless a ``tp``-GPU instance can hold them all."""
        out = tuple(dict.fromkeys(models))
        unknown = [m for m in out if m not in self.archs]
        if unknown:
            raise ValueError(f"{what}: models {unknown} are not served by any service ({sorted(self.archs)})")
        if out:
            pool_layout(
                self.spec.cluster.hw, tp, [self.archs[m] for m in out], self.spec.engine
            )  # DoesNotFit
        return out

    def coming(self, model: str) -> bool:
        """Some instance is loading ``model`` or will (waiting for memory or GPUs)."""
        return any(
            model in i.loading or model in i.to_load for i in self.instances.values() if i.released_s is None
        )

    def busy(self) -> bool:
        """Work that will produce events: a batch in flight, a move or a model load under way."""
        return self.moves.moving > 0 or any(i.work is not None or i.loading for i in self.instances.values())

    def held(self) -> dict[str, int]:
        """Per service: arrivals waiting for capacity now (cold or saturated)."""
        return self.holds.held()

    def set_binding(self, binding: Binding, saturation: Saturation | None = None) -> None:
        """``early`` (dispatch on arrival) or ``late`` (wait while every host is saturated)."""
        if binding not in BINDINGS:
            raise ValueError(f"binding must be 'early' or 'late', got {binding!r}")
        self.binding = binding
        if saturation is not None:
            self.saturation = saturation
        if binding == "late":
            self.load_blind = False  # room is read from the instances' state

    def restrict(self, instance_ids: Iterable[str]) -> None:
        """Keep only these instances (one part of a partitioned run)."""
        keep = set(instance_ids)
        self.instances = {i: inst for i, inst in self.instances.items() if i in keep}

    # ------------------------------------------------------------------------------------------ requests
    def dispatch_request(
        self,
        request_id: str,
        svc: SimService,
        prompt_tokens: int,
        predicted: float | None,
        now: float,
        prompt: str = "",
        session: str = "",
    ) -> DispatchRequest:
        """What the dispatch policy is told of a request of ``svc`` (``prompt``: its text, for policies
        that read it; ``session``: its conversation); a service of a LoRA adapter names the adapter,
        with its base."""
        return DispatchRequest(request_id, svc.routed_model, svc.name, prompt_tokens, predicted or 0.0,
                               self.kv_bytes_per_token[svc.model], now, prompt, session,
                               svc.model if svc.adapter else "")  # fmt: skip

    def prompt_of(self, wr: object) -> tuple[str, str]:
        """(prompt text, session) of a workload request for its dispatch request: the text only when the
        dispatch policy reads it; ("", "") for anything else (a request that says neither, or None)."""
        if not isinstance(wr, WorkloadRequest):
            return "", ""
        return (prompt_text(wr) if self.reads_prompt else ""), wr.session

    def pick_instance(
        self,
        svc: SimService,
        req: DispatchRequest,
        exclude: frozenset[str] = frozenset(),
        *,
        late: bool = False,
    ) -> str:
        """The dispatch policy's choice among the instances serving ``svc``'s model (NoCandidate if none).
        ``late``: an arrival under late binding, only among instances with room (Saturated if none)."""
        if self.book.reads_progress:  # progress moves with time on every busy instance
            self.book.touch_busy(self.instances)
        if not self.load_blind:
            self.book.refresh(self.instances)
        counting = self._counting
        before = counting.infeasible if counting is not None else 0
        routed = svc.routed_model  # an adapter's hosts are its base's with LoRA on
        cands = self.book.by_model.get(routed, ())
        if late:
            cands = self.holds.room(svc.model, self.book.by_model.get(routed)) or cands
        iid = self.dispatch.choose(routed, cands, exclude, request=req)
        if counting is not None and counting.infeasible != before:
            self.infeasible[svc.model] = self.infeasible.get(svc.model, 0) + 1
        return iid

    def admit(
        self, rec: RequestRecord, svc: SimService, iid: str, predicted: float | None, now: float
    ) -> None:
        """Hand an arrived request to instance ``iid`` at ``now``."""
        inst = self.instances[iid]
        rec.instance, ref = iid, self.reference_tp[svc.model]
        if rec.dispatched_s is None:  # its engine's receipt, after any hold
            rec.dispatched_s = now
        rec.solo_s = self.cost.solo_time(svc.model, ref, rec.prompt_tokens, rec.output_tokens)
        deadline = rec.arrival_s + svc.deadline_s if svc.deadline_s is not None else None
        priority = request_priority(rec.priority, svc.priority, None)
        inst.admit(rec, svc.max_tokens, now, predicted, deadline, svc.lora_rank, priority)
        self._where[rec.request_id] = inst
        self.holds.served(rec)
        self.kick(inst, now)

    def hold(self, rec: RequestRecord, predicted: float | None, reason: str = COLD) -> bool:
        """Keep an arrival no instance can take now; False (it fails) when nothing will bring capacity."""
        return self.holds.hold(rec, predicted, reason)

    def fail_held(self, why: str) -> None:
        """Every arrival waiting for capacity fails with ``why``."""
        self.holds.fail_all(why)

    def held_ahead(self, model: str) -> bool:
        """Late binding: requests of ``model`` already wait for room."""
        return self.binding == "late" and self.holds.ahead(model)

    def track(self, request_id: str, inst: SimInstance) -> None:
        """``request_id`` is on ``inst`` now (for drivers that admit requests themselves)."""
        self._where[request_id] = inst

    def release(self, request_id: str) -> None:
        """``request_id`` is on no instance any more (finished, failed, or back in a central pool)."""
        self._where.pop(request_id, None)

    def fail_request(self, r: CoreRequest, why: str) -> None:
        rec = record_of(r)
        rec.failed = why
        self._where.pop(rec.request_id, None)

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
        return self.moves.move_request(request_id, instance_id, transfer_s, now, reprefill=reprefill)

    def land(self, r: CoreRequest, dst: SimInstance, now: float) -> None:
        """A ``MOVE`` event: a moved request reached ``dst``."""
        self.moves.arrived(r, dst, now)

    def step_ended(
        self, iid: str, version: int, now: float, on_finish: Callable[[str, str, int, float], None] | None
    ) -> None:
        """An ``END`` event of ``iid``'s step (ignored when a cut chunk superseded it): its finished
        requests leave the fleet (``on_finish(request id, instance id, output tokens, now)`` each), its
        next step starts, and the held arrivals of its models get a chance at the room it made."""
        inst = self.instances[iid]
        if version != inst.version or inst.work is None:
            return  # superseded by a truncated chunk
        for r in inst.finish_work(now):
            self._where.pop(r.sched.request_id, None)
            if on_finish is not None:
                on_finish(r.sched.request_id, iid, record_of(r).output_tokens, now)
        self.kick(inst, now)
        if self.holds:  # late binding: a step end may have made room
            for m in inst.serving:
                if m in self.holds:
                    self.holds.serve(m, now)

    def kick(self, inst: SimInstance, now: float) -> None:
        """Start ``inst``'s next step if it is idle (applying its pending moves and changes first), else
        cut its fast-forwarded chunk to the iteration in progress."""
        if not self.load_blind:
            self.book.touch(inst.instance_id)
        if inst.work is not None:
            end = inst.interrupt(now)
            if end is not None:
                self.events.push(end, END, inst.instance_id, inst.version)
            return
        if inst.outbound:
            self.moves.flush_outbound(inst, now)
        if inst.landing and inst.core.static_batch is None:
            for r in inst.landing:
                self.moves.join(r, inst, now)
            inst.landing.clear()
        if inst.pending and inst.core.static_batch is None:
            self.changes.settle(inst, now)
            if inst.released_s is not None:
                return
        if self.on_idle is not None and inst.core.static_batch is None:
            self.on_idle(inst, now)
        end = inst.start(now, self.fail_request)
        if end is None and inst.pending and inst.core.static_batch is None:
            self.changes.settle(inst, now)  # idle now (its last requests may have failed): unload, release
            return
        if end is not None:
            self.events.push(end, END, inst.instance_id, inst.version)

    # ------------------------------------------------------------------------------------------- changes
    def add_instance(self, plan: InstancePlan, ready_at: float) -> None:
        """A new instance of ``plan``, serving from ``ready_at`` (:meth:`FleetChanges.add_instance`)."""
        self.changes.add_instance(plan, ready_at)

    def set_models(self, instance_id: str, models: Sequence[str], now: float, *, mode: str = "move") -> None:
        """Make ``instance_id`` host ``models`` (:meth:`FleetChanges.set_models`). ``mode``: "move" the
        removed models' requests to other instances serving them where possible, or "drain" them here."""
        self.changes.set_models(instance_id, models, now, mode=mode)

    def retire_instance(self, instance_id: str, now: float, mode: str = "move") -> None:
        """Remove every model of ``instance_id``; it gives its GPUs back once its requests have left."""
        self.changes.set_models(instance_id, (), now, mode=mode)

    def ready(self, iid: str, model: str, t: float) -> None:
        """A ``READY`` event: ``model``'s weights are on ``iid`` (:meth:`FleetChanges.ready`)."""
        self.changes.ready(iid, model, t)

    @property
    def gpus_used(self) -> int:
        return self.changes.gpus_used

    @property
    def gpu_log(self) -> list[tuple[float, int]]:
        """(time, GPUs in use) at each change."""
        return self.changes.gpu_log

    @property
    def fleet_changes(self) -> int:
        """Placement changes asked for so far (instances added, model sets changed)."""
        return self.changes.count
