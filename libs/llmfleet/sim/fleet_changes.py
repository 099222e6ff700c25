"""Placement changes inside a simulation (a part of :class:`~llmfleet.sim.fleet.Fleet`): instances added,
their models changed, instances retired, and the GPUs they hold over time.

- :meth:`FleetChanges.add_instance` takes ``tp`` free GPUs (or waits, first fit, for instances being
  retired to give theirs back) and loads its models: it takes requests from ``ready_at`` on.
- :meth:`FleetChanges.set_models` changes an instance's models. A removed model takes no new request at
  once; at the instance's next step boundary (:meth:`FleetChanges.settle`) its queued and running requests
  move to another instance serving it (chosen by the dispatch policy; a running request's KV travels at
  the cluster's link bandwidth, ``Fleet.kv_transfer_s``; a waiting one re-prefills there) or, with no such
  instance, drain here; the model unloads once none of its requests is here or on its way. An added model
  loads while the others keep serving (SeaLLM pulls weights asynchronously): its memory is claimed as soon
  as it fits beside the resident models — else after the removed ones unload — and it serves
  ``Fleet.load_time_s`` later. A new KV pool is sized for each resident set (:meth:`SimInstance.rehost`).
  Removing every model retires the instance: once empty it gives its GPUs back.

An instance counts its GPUs from when it takes them until it gives them back (``gpu_log``).
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.policies.placement.base import InstancePlan
from llmfleet.sim.candidates import CandidateBook
from llmfleet.sim.events import READY
from llmfleet.sim.fleet_view import FleetView
from llmfleet.sim.holds import Holds
from llmfleet.sim.instance import SimInstance
from llmfleet.sim.memory import pool_layout
from llmfleet.sim.moves import Moves


class FleetChanges:
    """The placement changes under way and the GPUs in use; it changes ``fleet``'s instances through its
    public API and the fleet's candidate book, holds and moves."""

    def __init__(self, fleet: FleetView, book: CandidateBook, holds: Holds, moves: Moves) -> None:
        self.fleet = fleet
        self._book, self._holds, self._moves = book, holds, moves
        self.gpus_used = sum(i.tp for i in fleet.instances.values())
        self.gpu_log: list[tuple[float, int]] = [(0.0, self.gpus_used)]  # (time, GPUs in use) at each change
        self.waiting: list[SimInstance] = []  # added instances waiting for GPUs, in order
        self.count = 0  # changes asked for (instances added, model sets changed)

    @property
    def gpus_free(self) -> int:
        return self.fleet.spec.cluster.count - self.gpus_used

    def add_instance(self, plan: InstancePlan, ready_at: float) -> None:
        """A new instance of ``plan``: it takes its GPUs now, or when retiring instances free enough, and
        serves ``ready_at − now`` seconds after taking them (the weights' load time)."""
        now = self.fleet.events.now
        if plan.instance_id in self.fleet.instances:
            raise ValueError(f"instance id {plan.instance_id!r} is already used")
        if ready_at < now:
            raise ValueError(f"ready_at {ready_at} is before now ({now})")
        count = self.fleet.spec.cluster.count
        if plan.tp > count:
            raise ValueError(f"instance {plan.instance_id} needs {plan.tp} GPUs, the cluster has {count}")
        self.fleet.check_models(plan.models, plan.tp, f"instance {plan.instance_id}")
        self.waiting.append(self._waiting_instance(plan, ready_at - now))
        self.count += 1
        self._take_gpus(now)

    def _waiting_instance(self, plan: InstancePlan, load_s: float) -> SimInstance:
        """An instance of ``plan`` holding no GPUs yet, its models to load in ``load_s`` once it has them."""
        inst = self.fleet.new_instance(plan)
        inst.serving, inst.started_s = (), None
        inst.to_load = dict.fromkeys(plan.models, load_s)
        self.fleet.instances[plan.instance_id] = inst
        return inst

    def set_models(self, instance_id: str, models: Sequence[str], now: float, *, mode: str = "move") -> None:
        """Make ``instance_id`` host ``models`` (see the module docstring). ``mode``: "move" the removed
        models' requests to other instances serving them where possible, or "drain" them here."""
        if mode not in ("move", "drain"):
            raise ValueError(f"mode must be 'move' or 'drain', got {mode!r}")
        inst = self.fleet.instances.get(instance_id)
        if inst is None or inst.released_s is not None:
            raise KeyError(f"no live instance {instance_id!r}; live: {sorted(self.fleet.hosting())}")
        target = self.fleet.check_models(models, inst.tp, f"instance {instance_id}")
        self.count += 1
        if inst.started_s is None:  # still waiting for GPUs: nothing is resident yet
            k = self.waiting.index(inst)
            if target:  # the same place in the queue, the new models (and their load time)
                plan = InstancePlan(instance_id, target, inst.tp)
                self.waiting[k] = self._waiting_instance(plan, self.fleet.load_time_s(target, inst.tp))
            else:
                del self.waiting[k]
                inst.released_s = now
                self._holds.check(now)
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
                inst.to_load[m] = self.fleet.load_time_s([m], inst.tp)
        served_before = set(inst.serving)
        inst.serving = tuple(m for m in inst.models if m in keep and m not in inst.loading)
        self._book.rebuild(self.fleet.instances)
        self._holds.check(now)
        self.fleet.kick(inst, now)
        for m in set(inst.serving) - served_before:  # kept after all: it can take others' requests again
            self._offer(m, now)

    def ready(self, iid: str, model: str, t: float) -> None:
        """A ``READY`` event: ``model``'s weights are on ``iid``; it serves from now (unless removed
        meanwhile)."""
        inst = self.fleet.instances[iid]
        if inst.loading.get(model) != t:
            return  # removed while loading, or loading again since
        del inst.loading[model]
        inst.serving = tuple(m for m in inst.models if m not in inst.loading and m not in inst.removing)
        self._book.rebuild(self.fleet.instances)
        self._holds.serve(model, t)
        self._offer(model, t)

    def _take_gpus(self, now: float) -> None:
        """Start the instances waiting for GPUs that fit now (first fit, in order of arrival)."""
        for inst in list(self.waiting):
            if inst.tp > self.gpus_free:
                continue
            self.waiting.remove(inst)
            inst.started_s = now
            self.gpus_used += inst.tp
            self._log_gpus(now)
            self._start_loads(inst, inst.to_load, now)
            inst.to_load = {}

    def _start_loads(self, inst: SimInstance, loads: dict[str, float], now: float) -> None:
        for m, dur in loads.items():
            inst.loading[m] = now + dur
            self.fleet.events.push(now + dur, READY, inst.instance_id, m)

    def _log_gpus(self, now: float) -> None:
        """Note the GPUs in use from ``now`` (one point per instant, only where the count changes)."""
        log = self.gpu_log
        if log and log[-1][0] == now:
            log.pop()
        if not log or log[-1][1] != self.gpus_used:
            log.append((now, self.gpus_used))

    def _offer(self, model: str, now: float) -> None:
        """``model`` is served somewhere new: instances removing it move its requests there at their next
        iteration boundary (a fast-forwarded chunk is cut to the iteration in progress)."""
        for inst in self.fleet.instances.values():
            if model in inst.removing and inst.move_out and inst.active:
                self.fleet.kick(inst, now)

    def settle(self, inst: SimInstance, now: float) -> None:
        """Apply ``inst``'s pending changes at a step boundary: move out the removed models' requests,
        unload the models left without requests, claim memory for the models to load."""
        core = inst.core
        if inst.removing and inst.move_out and self._book.by_model:
            for r in [r for r in core.requests.values() if r.sched.model in inst.removing]:
                self._moves.move_out(inst, r, now)
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
        self._start_loads(inst, loads, now)
        if not inst.models and not inst.to_load and not core.requests:
            inst.released_s = now
            self.gpus_used -= inst.tp
            self._log_gpus(now)
            self._book.rebuild(self.fleet.instances)
            self._take_gpus(now)
