"""What etcd says about the fleet at one moment, and what a run's samples add up to.

A :class:`FleetSample` holds the engines (``nodes/`` records with role ``engine``: tp, hardware, the
models they host), the placement plan (``placement/`` keys and ``placement_meta``) and the migration
leader's ``migration_state`` (epoch, active engines). From the samples of a run:

- :func:`gpu_log`: GPUs in use over time — Σ tp of the engines hosting at least one model — as
  (t, GPUs) change points, the simulator's ``gpu_log`` form;
- :func:`placement_decisions`: one decision per plan the placement leader wrote (a new ``plan_id``, or
  a changed ``placement/`` without one), in the simulator's decision schema (``llmfleet.sim.replan``).

Model names are mapped through ``names`` (live model → cost-model catalog name) so that plans read as
the simulator's do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmfleet.policies.placement import InstancePlan
from llmfleet.policies.placement.assign import moves
from llmfleet.sim.replan import Decision, plan_summary


@dataclass(frozen=True)
class EngineState:
    engine_id: str
    tp: int = 1
    hardware: str = ""
    models: tuple[str, ...] = ()  # loaded (the engine's own node record)


@dataclass(frozen=True)
class FleetSample:
    """The fleet at ``t`` seconds from the run's start."""

    t: float
    engines: tuple[EngineState, ...] = ()
    placement: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # engine -> desired models
    plan_id: int | None = None  # placement_meta (None: no planner has written one)
    plan_policy: str = ""
    plan_reason: str = ""
    migration_epoch: int | None = None
    migration_policy: str = ""
    active: tuple[str, ...] | None = None  # engines the migration leader keeps active (None: all)

    @property
    def gpus_in_use(self) -> int:
        return sum(max(e.tp, 1) for e in self.engines if e.models)

    @property
    def gpus_total(self) -> int:
        return sum(max(e.tp, 1) for e in self.engines)

    def tp_of(self, engine_id: str) -> int:
        return next((max(e.tp, 1) for e in self.engines if e.engine_id == engine_id), 1)

    def plan(self, names: Mapping[str, str] | None = None) -> list[InstancePlan]:
        """The placement plan in force: ``placement/`` when the leader wrote one, else what engines host."""
        names = names or {}
        hosted = self.placement or {e.engine_id: e.models for e in self.engines}
        return [
            InstancePlan(eid, tuple(sorted(names.get(m, m) for m in ms)), self.tp_of(eid))
            for eid, ms in sorted(hosted.items())
            if ms
        ]


def gpu_log(samples: Sequence[FleetSample]) -> list[tuple[float, int]]:
    """(t, GPUs in use) at the first sample and at each change."""
    out: list[tuple[float, int]] = []
    for s in samples:
        n = s.gpus_in_use
        if not out or out[-1][1] != n:
            out.append((s.t, n))
    return out


def _assignment(plan: Sequence[InstancePlan]) -> dict[str, tuple[str, ...]]:
    return {p.instance_id: p.models for p in plan}


def _changes(before: Mapping[str, Sequence[str]], after: Mapping[str, Sequence[str]]) -> list[str]:
    """Per engine ``"e: +m -m"``, ``"e: retired"``, as the simulator words them."""
    out = []
    for eid in sorted(set(before) | set(after)):
        a, b = set(before.get(eid, ())), set(after.get(eid, ()))
        if a == b:
            continue
        if not b:
            out.append(f"{eid}: retired")
            continue
        delta = [f"+{m}" for m in sorted(b - a)] + [f"-{m}" for m in sorted(a - b)]
        out.append(f"{eid}: {' '.join(delta)}")
    return out


def placement_decisions(samples: Sequence[FleetSample], names: Mapping[str, str] | None = None) -> list[dict]:
    """The plans written during the run (the first sample's plan is the run's starting plan, not a
    decision), each as ``llmfleet.sim.replan.Decision.to_dict()`` plus ``plan_id``."""
    out: list[dict] = []
    if not samples:
        return out
    prev = samples[0]
    prev_plan = _assignment(prev.plan(names))
    for s in samples[1:]:
        plan = s.plan(names)
        now = _assignment(plan)
        new_id = s.plan_id is not None and s.plan_id != prev.plan_id
        if not new_id and now == prev_plan:
            prev = s
            continue
        d = Decision(
            t=s.t,
            plan=plan_summary(plan),
            gpus_in_use=sum(p.tp for p in plan),
            moves=moves(prev_plan, now),
            changes=_changes(prev_plan, now),
            status="applied",
            reason=s.plan_reason if new_id else "",
        ).to_dict()
        d["plan_id"] = s.plan_id
        out.append(d)
        prev, prev_plan = s, now
    return out


def plan_sequence(initial: str, decisions: Sequence[Mapping]) -> list[str]:
    """The distinct plans in force one after another (consecutive repeats collapsed): the starting plan's
    summary, then each applied decision's. Works on a simulator report and a live one alike."""
    seq = [initial] if initial else []
    for d in decisions:
        if (
            d.get("status", "applied") == "applied"
            and not d.get("error")
            and (not seq or seq[-1] != d["plan"])
        ):
            seq.append(d["plan"])
    return seq
