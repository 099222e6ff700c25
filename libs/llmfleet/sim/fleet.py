"""Instances that come and go: placement changes inside a simulation (driven by
:class:`llmfleet.sim.replan.PlacementLoop`, or by hand through the hooks).

* :meth:`Fleet.add_instance` takes ``tp`` free GPUs (or waits, first fit, for instances being retired
  to give theirs back) and loads its models: it takes requests from ``ready_at`` on.
* :meth:`Fleet.set_models` changes an instance's models. A removed model takes no new request at once;
  at the instance's next step boundary its queued and running requests move to another instance
  serving it (chosen by the dispatch policy; a running request's KV travels at the cluster's link
  bandwidth, :meth:`Fleet.kv_transfer_s`; a waiting one re-prefills there) or, with no such instance,
  drain here; the model unloads once none of its requests is here or on its way. An added model loads
  while the others keep serving (SeaLLM pulls weights asynchronously): its memory is claimed as soon
  as it fits beside the resident models — else after the removed ones unload — and it serves
  :meth:`Fleet.load_time_s` later. A new KV pool is sized for each resident set
  (:meth:`SimInstance.rehost`).
* :meth:`Fleet.retire_instance` removes every model; once empty the instance gives its GPUs back.

An instance counts its GPUs from when it takes them until it gives them back (``gpu_log``).

Requests wait for capacity as in the live scheduler (issue 26, ``llmfleet.policies.capacity``): a
request for a model no instance serves waits when some instance is loading it; else, with a placement
loop installed (``wake``) and ``cold_start`` on, it waits up to its service's cold-start timeout
and wakes the loop at once (scale from zero); else it fails with the reason. With ``binding = "late"``
a request whose model's every instance is saturated (``Saturation``) waits too, and goes to the first
instance with room (at a step end, or when an instance is ready); the first of them (the model's queue
was empty) wakes the placement loop too, as the live scheduler's report does. Waiting requests are dispatched in
the :class:`~llmfleet.policies.capacity.HoldQueue` order; no request is lost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmfleet.costmodel.memory import load_seconds
from llmfleet.engine_core import CoreRequest
from llmfleet.policies.capacity import HoldQueue, Saturation, cold_start_timeout_s
from llmfleet.policies.dispatch import DispatchPolicy, DispatchRequest, EngineCandidate, HostList, NoCandidate
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.sim.cost import CostBook
from llmfleet.sim.events import HOOK, MOVE, READY
from llmfleet.sim.instance import SimInstance, record_of
from llmfleet.sim.memory import pool_layout
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.spec import SimService, SimSpec

Hook = Callable[[Any, float], None]
COLD, SATURATED = "cold", "saturated"


@dataclass(slots=True)
class Held:
    """An arrival waiting for capacity: ``reason`` cold (no instance serves its model) or saturated
    (late binding: every instance serving it is full); ``deadline`` of a cold wait (inf: none)."""

    rec: RequestRecord
    predicted: float | None
    reason: str
    deadline: float = float("inf")


class Saturated(LookupError):
    """Late binding: every instance serving the model is saturated (the request waits)."""


class Fleet:
    """Mixin of :class:`~llmfleet.sim.simulator.Simulator`: its instance set over time."""

    # the Simulator's state used here
    spec: SimSpec
    cost: CostBook
    dispatch: DispatchPolicy
    instances: dict[str, SimInstance]
    now: float
    load_blind: bool
    _cands: dict[str, HostList]
    _slot: dict[str, list[tuple[str, int]]]
    _where: dict[str, SimInstance]
    _moving: int
    _kv_bytes_per_token: dict[str, int]

    if TYPE_CHECKING:  # provided by the Simulator

        def _push(self, t: float, kind: int, a: object = None, b: object = None) -> None: ...

        def _kick(self, inst: SimInstance, now: float) -> None: ...

        def _refresh(self) -> None: ...

        def _new_instance(self, plan: InstancePlan) -> SimInstance: ...

        def _service(self, name: str) -> SimService: ...

        def _dispatch(
            self, svc: SimService, req: DispatchRequest, exclude: frozenset[str], *, late: bool = False
        ) -> str: ...

        def _admit(
            self, rec: RequestRecord, svc: SimService, iid: str, predicted: float | None, now: float
        ) -> None: ...

        def _candidate(self, inst: SimInstance) -> EngineCandidate: ...

    def _init_fleet(self) -> None:
        hw, count = self.spec.cluster.hw, self.spec.cluster.count
        # instances are not mapped to nodes: a multi-node cluster moves KV over the network
        self.kv_link_bytes_per_s = hw.intra_node_bw if count <= hw.gpus_per_node else hw.inter_node_bw
        self.gpus_used = sum(i.tp for i in self.instances.values())
        self.gpu_log: list[tuple[float, int]] = [(0.0, self.gpus_used)]  # (time, GPUs in use) at each change
        self._waiting_gpus: list[SimInstance] = []  # added instances waiting for GPUs, in order
        self._held: dict[str, HoldQueue[Held]] = {}  # model -> arrivals waiting for capacity
        # requests wait for capacity (module docstring): late binding, and the placement loop's wake-up
        # for a model no instance serves or a queue starting (set by llmfleet.sim.replan.PlacementLoop)
        self.binding = "early"
        self.saturation = Saturation()
        self.cold_start = True
        self.wake: Callable[[float], None] | None = None
        self._one_shots = 0
        self.fleet_changes = 0

    # -------------------------------------------------------------------------------------- queries
    def load_time_s(self, models: Sequence[str], tp: int) -> float:
        """Seconds to load ``models``' weights onto a ``tp``-GPU instance (``costmodel.memory.load_seconds``)."""
        archs = self.spec.archs()
        return load_seconds([archs[m] for m in models], self.spec.cluster.hw, tp)

    def kv_transfer_s(self, model: str, tokens: int) -> float:
        """Seconds to move ``tokens`` of ``model``'s KV between instances."""
        return tokens * self._kv_bytes_per_token[model] / self.kv_link_bytes_per_s

    @property
    def gpus_free(self) -> int:
        return self.spec.cluster.count - self.gpus_used

    def hosting(self) -> dict[str, tuple[int, tuple[str, ...]]]:
        """instance id -> (tp, the models it will host once the changes under way are done), for every
        instance not given back (waiting for GPUs included)."""
        return {iid: (i.tp, i.target) for iid, i in self.instances.items() if i.released_s is None}

    def _live(self, instance_id: str) -> SimInstance:
        inst = self.instances.get(instance_id)
        if inst is None or inst.released_s is not None:
            raise KeyError(f"no live instance {instance_id!r}; live: {sorted(self.hosting())}")
        return inst

    def check_models(self, models: Sequence[str], tp: int, what: str) -> tuple[str, ...]:
        """``models`` without repeats; ValueError unless a ``tp``-GPU instance can hold them all."""
        out = tuple(dict.fromkeys(models))
        archs = self.spec.archs()
        unknown = [m for m in out if m not in archs]
        if unknown:
            raise ValueError(f"{what}: models {unknown} are not served by any service ({sorted(archs)})")
        if out:
            pool_layout(self.spec.cluster.hw, tp, [archs[m] for m in out], self.spec.engine)  # DoesNotFit
        return out

    # -------------------------------------------------------------------------------------- changes
    def at(self, t: float, fn: Hook) -> None:
        """Call ``fn(sim, t)`` once at simulated time ``t`` (not before now)."""
        if t < self.now:
            raise ValueError(f"cannot schedule a hook at {t}, before now ({self.now})")
        self._one_shots += 1
        self._push(t, HOOK, None, fn)  # no period: once

    def add_instance(self, plan: InstancePlan, ready_at: float) -> None:
        """A new instance of ``plan``: it takes its GPUs now, or when retiring instances free enough, and
        serves ``ready_at − now`` seconds after taking them (the weights' load time)."""
        now = self.now
        if plan.instance_id in self.instances:
            raise ValueError(f"instance id {plan.instance_id!r} is already used")
        if ready_at < now:
            raise ValueError(f"ready_at {ready_at} is before now ({now})")
        if plan.tp > self.spec.cluster.count:
            raise ValueError(
                f"instance {plan.instance_id} needs {plan.tp} GPUs, the cluster has {self.spec.cluster.count}"
            )
        self.check_models(plan.models, plan.tp, f"instance {plan.instance_id}")
        self._waiting_gpus.append(self._waiting_instance(plan, ready_at - now))
        self.fleet_changes += 1
        self._take_gpus(now)

    def _waiting_instance(self, plan: InstancePlan, load_s: float) -> SimInstance:
        """An instance of ``plan`` holding no GPUs yet, its models to load in ``load_s`` once it has them."""
        inst = self._new_instance(plan)
        inst.serving, inst.started_s = (), None
        inst.to_load = dict.fromkeys(plan.models, load_s)
        self.instances[plan.instance_id] = inst
        return inst

    def set_models(self, instance_id: str, models: Sequence[str], now: float, *, mode: str = "move") -> None:
        """Make ``instance_id`` host ``models`` (see the module docstring). ``mode``: "move" the removed
        models' requests to other instances serving them where possible, or "drain" them here."""
        if mode not in ("move", "drain"):
            raise ValueError(f"mode must be 'move' or 'drain', got {mode!r}")
        inst = self._live(instance_id)
        target = self.check_models(models, inst.tp, f"instance {instance_id}")
        self.fleet_changes += 1
        if inst.started_s is None:  # still waiting for GPUs: nothing is resident yet
            k = self._waiting_gpus.index(inst)
            if target:  # the same place in the queue, the new models (and their load time)
                plan = InstancePlan(instance_id, target, inst.tp)
                self._waiting_gpus[k] = self._waiting_instance(plan, self.load_time_s(target, inst.tp))
            else:
                del self._waiting_gpus[k]
                inst.released_s = now
                self._check_held(now)
            return
        inst.move_out = mode == "move"
        keep = set(target)
        for m in inst.models:
            if m not in keep:
                if m in inst.loading:  # its load stops counting (the READY event is kept for a return)
                    inst.cancelled[m] = inst.loading.pop(m)
                inst.removing.add(m)
            elif m in inst.removing:  # kept after all: still resident, it serves again (or loads on)
                inst.removing.discard(m)
                if m in inst.cancelled:
                    inst.loading[m] = inst.cancelled.pop(m)
        inst.to_load = {m: d for m, d in inst.to_load.items() if m in keep}
        for m in target:
            if m not in inst.models and m not in inst.to_load:
                inst.to_load[m] = self.load_time_s([m], inst.tp)
        served_before = set(inst.serving)
        inst.serving = tuple(m for m in inst.models if m in keep and m not in inst.loading)
        self._rebuild_cands()
        self._check_held(now)
        self._kick(inst, now)
        for m in set(inst.serving) - served_before:  # kept after all: it can take others' requests again
            self._offer(m, now)

    def retire_instance(self, instance_id: str, now: float, mode: str = "move") -> None:
        """Remove every model of ``instance_id``; it gives its GPUs back once its requests have left."""
        self.set_models(instance_id, (), now, mode=mode)

    # ------------------------------------------------------------------------------------- internals
    def _take_gpus(self, now: float) -> None:
        """Start the instances waiting for GPUs that fit now (first fit, in order of arrival)."""
        for inst in list(self._waiting_gpus):
            if inst.tp > self.gpus_free:
                continue
            self._waiting_gpus.remove(inst)
            inst.started_s = now
            self.gpus_used += inst.tp
            self._log_gpus(now)
            for m, dur in inst.to_load.items():
                inst.loading[m] = now + dur
                self._push(now + dur, READY, inst.instance_id, m)
            inst.to_load = {}

    def _log_gpus(self, now: float) -> None:
        """Note the GPUs in use from ``now`` (one point per instant, only where the count changes)."""
        log = self.gpu_log
        if log and log[-1][0] == now:
            log.pop()
        if not log or log[-1][1] != self.gpus_used:
            log.append((now, self.gpus_used))

    def _ready(self, iid: str, model: str, t: float) -> None:
        """``model``'s weights are on ``iid``: it serves from now (unless removed meanwhile)."""
        inst = self.instances[iid]
        if inst.loading.get(model) != t:
            return  # removed while loading, or loading again since
        del inst.loading[model]
        inst.serving = tuple(m for m in inst.models if m not in inst.loading and m not in inst.removing)
        self._rebuild_cands()
        self._serve_held(model, t)
        self._offer(model, t)

    def _offer(self, model: str, now: float) -> None:
        """``model`` is served somewhere new: instances removing it move its requests there at their next
        iteration boundary (a fast-forwarded chunk is cut to the iteration in progress)."""
        for inst in self.instances.values():
            if model in inst.removing and inst.move_out and inst.active:
                self._kick(inst, now)

    def _settle(self, inst: SimInstance, now: float) -> None:
        """Apply ``inst``'s pending changes at a step boundary: move out the removed models' requests,
        unload the models left without requests, claim memory for the models to load."""
        core = inst.core
        if inst.removing and inst.move_out and self._cands:
            for r in [r for r in core.requests.values() if r.sched.model in inst.removing]:
                self._move_out(inst, r, now)
        held = {r.sched.model for r in core.requests.values()}
        gone = {m for m in inst.removing if m not in held and not inst.inbound.get(m)}
        resident = tuple(m for m in inst.models if m not in gone)
        want = resident + tuple(inst.to_load)
        loads = {}
        if inst.to_load and want:
            try:
                pool_layout(inst.hw, inst.tp, [inst.archs[m] for m in want], inst.engine)
                loads, inst.to_load, resident = inst.to_load, {}, want
            except ValueError:  # DoesNotFit: wait for the removed models to unload
                pass
        if resident != inst.models:
            inst.removing -= gone
            for m in gone:
                inst.cancelled.pop(m, None)
            if resident:
                inst.rehost(resident, now)
            else:
                inst.models = ()
        for m, dur in loads.items():
            inst.loading[m] = now + dur
            self._push(now + dur, READY, inst.instance_id, m)
        if not inst.models and not inst.to_load and not core.requests:
            inst.released_s = now
            self.gpus_used -= inst.tp
            self._log_gpus(now)
            self._rebuild_cands()
            self._take_gpus(now)

    def _move_out(self, src: SimInstance, r: CoreRequest, now: float) -> None:
        """Move a request of a model ``src`` is removing to an instance serving it (the dispatch
        policy picks it); it stays (drains) when none does."""
        model = r.sched.model
        if not self._cands.get(model):
            return
        rec = record_of(r)
        svc = self._service(rec.service)
        req = DispatchRequest(
            rec.request_id, model, svc.name, rec.prompt_tokens, r.sched.predicted_output_tokens or 0.0,
            self._kv_bytes_per_token[model], now,
        )  # fmt: skip
        try:
            iid = self._dispatch(svc, req, frozenset((src.instance_id,)))
        except NoCandidate:
            return
        dst = self.instances[iid]
        kv = r.kv_tokens if r.sched.phase == "decode" else 0
        if src.core.remove(rec.request_id) is None:
            return  # in the step in flight (cannot happen between steps)
        rec.moves += 1
        self._where[rec.request_id] = dst
        self._moving += 1
        dst.inbound[model] = dst.inbound.get(model, 0) + 1
        self._push(now + self.kv_transfer_s(model, kv), MOVE, r, dst)

    def _rebuild_cands(self) -> None:
        """Dispatch candidates: per model, the instances serving it, by id."""
        self._cands, self._slot = {}, {}
        for iid, inst in sorted(self.instances.items()):
            if not inst.serving or not inst.active:
                continue
            c = self._candidate(inst)
            for m in inst.serving:
                lst = self._cands.setdefault(m, HostList(m))
                self._slot.setdefault(iid, []).append((m, len(lst)))
                lst.append(c)

    def _coming(self, model: str) -> bool:
        """Some instance is loading ``model`` or will (waiting for memory or GPUs)."""
        return any(
            model in i.loading or model in i.to_load for i in self.instances.values() if i.released_s is None
        )

    def set_binding(self, binding: str, saturation: Saturation | None = None) -> None:
        """``early`` (dispatch on arrival) or ``late`` (wait while every host is saturated)."""
        if binding not in ("early", "late"):
            raise ValueError(f"binding must be 'early' or 'late', got {binding!r}")
        self.binding = binding
        if saturation is not None:
            self.saturation = saturation
        if binding == "late":
            self.load_blind = False  # room is read from the instances' state

    def _room(self, model: str) -> HostList | None:
        """Late binding: the candidates serving ``model`` with room (None: early binding, all of them);
        raises :class:`Saturated` when some serve it and none has room."""
        if self.binding != "late":
            return None
        cands = self._cands.get(model)
        if not cands:
            return None  # nobody serves it: NoCandidate (a cold wait), not saturation
        room = self.saturation.with_room(cands)
        if not room:
            raise Saturated(model)
        return HostList(model, room) if len(room) < len(cands) else cands

    def held(self) -> dict[str, int]:
        """Per service: arrivals waiting for capacity now (cold or saturated)."""
        out: dict[str, int] = {}
        for q in self._held.values():
            for h in q.items():
                out[h.rec.service] = out.get(h.rec.service, 0) + 1
        return out

    def _held_ahead(self, model: str) -> bool:
        return bool(self._held.get(model))

    def _hold(self, rec: RequestRecord, predicted: float | None, reason: str = COLD) -> bool:
        """Keep an arrival that no instance can take now (see the module docstring); False (it fails) when
        nothing will ever bring capacity for it."""
        q = self._held.setdefault(rec.model, HoldQueue())
        if reason == SATURATED and not q and self.wake is not None:
            self.wake(self.now)  # a queue starts to build: the placement loop plans now
        held = Held(rec, predicted, reason)
        if reason == COLD and not self._coming(rec.model) and not self._cold_wait(held):
            if not q:
                del self._held[rec.model]
            return False
        svc = self._service(rec.service)
        q.push(rec.request_id, held, rec.arrival_s, svc.priority, held.deadline)
        return True

    def _cold_wait(self, held: Held) -> bool:
        """Start ``held``'s cold wait (bounded; the placement loop woken now); False when there is no loop
        to place its model or cold starts are off."""
        if not self.cold_start or self.wake is None:
            return False
        svc = self._service(held.rec.service)
        held.deadline = self.now + cold_start_timeout_s(svc.cold_start_timeout_s, svc.slo.ttft_s)
        model, rid = held.rec.model, held.rec.request_id
        self.at(held.deadline, lambda sim, t: self._expire_held(model, rid, t))
        self.wake(self.now)
        return True

    def _expire_held(self, model: str, request_id: str, now: float) -> None:
        q = self._held.get(model)
        held = q.remove(request_id) if q is not None else None
        if held is None:
            return
        waited = now - held.rec.arrival_s
        held.rec.failed = f"no instance loaded model {model!r} within {waited:.1f}s (the cold-start timeout)"
        if not q:
            del self._held[model]

    def _serve_held(self, model: str, now: float) -> None:
        """Dispatch ``model``'s waiting arrivals, in order, while an instance can take them."""
        q = self._held.get(model)
        while q:
            held = q.peek()
            assert held is not None
            rec = held.rec
            svc = self._service(rec.service)
            req = DispatchRequest(
                rec.request_id, model, svc.name, rec.prompt_tokens, held.predicted or 0.0,
                self._kv_bytes_per_token[model], now,
            )  # fmt: skip
            try:
                iid = self._dispatch(svc, req, frozenset(), late=True)
            except (NoCandidate, Saturated):
                return
            q.pop()
            self._admit(rec, svc, iid, held.predicted, now)
        self._held.pop(model, None)

    def _check_held(self, now: float) -> None:
        """Serve the waiting arrivals of models an instance serves; those of models no instance serves or
        loads any more start a cold wait (or fail, when none can start)."""
        for model in list(self._held):
            if self._cands.get(model):
                self._serve_held(model, now)
            elif not self._coming(model):
                q = self._held[model]
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
                if not q:
                    del self._held[model]

    def _fail_held(self, model: str, why: str) -> None:
        q = self._held.pop(model, None)
        for held in q.items() if q is not None else ():
            held.rec.failed = f"no instance serves model {model!r}: {why}"

    def _land_guard(self, r: CoreRequest, dst: SimInstance) -> bool:
        """Count the landing of a moved request; False when ``dst`` no longer holds its model."""
        model = r.sched.model
        n = dst.inbound.get(model, 0)
        if n:
            dst.inbound[model] = n - 1
        return model in dst.tpb and dst.active
