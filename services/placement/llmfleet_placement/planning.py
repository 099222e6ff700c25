"""The pure half of the live placement loop: engine pool, name mapping, planning, hysteresis.

Everything here is plain data in, plain data out (no etcd, no clock): the loop in ``live.py`` reads
etcd and the monitor, calls :func:`plan_target`, asks :class:`Hysteresis` whether to apply the result
and writes it.

Names: services and engines speak *served* model names (the cluster config's ``models:`` keys);
planners speak cost-model *catalog* names (``sim_model``, else the served name when it is one).
:class:`ModelNames` is the one-to-one mapping both ways (the config refuses two served models with one
catalog name).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llmfleet.costmodel.hardware import UnknownHardware, hardware
from llmfleet.policies.placement import (
    EngineSlot,
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementPlanner,
    ServiceLoad,
    assign_plan,
    gpus_in_use,
)
from llmfleet.policies.placement.backlog import with_backlog
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, NodeRecord

Assignment = dict[str, tuple[str, ...]]  # engine id -> served model names (sorted; () = idle)


@dataclass(frozen=True)
class ModelNames:
    """Served checkpoint name <-> cost-model catalog name, one to one; a LoRA adapter (``bases``: adapter
    -> its base) maps to its base's catalog name, so its service's demand counts on the base (engines
    load bases; an adapter follows its traffic onto the engines hosting its base)."""

    to_catalog: Mapping[str, str]
    bases: Mapping[str, str] = field(default_factory=dict)
    to_served: Mapping[str, str] = field(init=False)

    def __post_init__(self) -> None:
        inverse = {c: s for s, c in self.to_catalog.items()}
        if len(inverse) != len(self.to_catalog):
            raise ValueError(f"two served models share a catalog name: {dict(self.to_catalog)}")
        object.__setattr__(self, "to_served", inverse)

    def host(self, served: str) -> str:
        """The checkpoint ``served`` runs on: its base for an adapter, else itself."""
        return self.bases.get(served, served)

    def catalog(self, served: str) -> str:
        try:
            return self.to_catalog[self.host(served)]
        except KeyError:
            raise ValueError(
                f"model {served!r} has no catalog name (known: {sorted(self.to_catalog)})"
            ) from None

    def served(self, catalog: str) -> str:
        try:
            return self.to_served[catalog]
        except KeyError:
            raise ValueError(
                f"the planner placed catalog model {catalog!r}, which no served model maps to "
                f"(known: {sorted(self.to_served)})"
            ) from None


@dataclass(frozen=True)
class LiveEngine:
    """One live engine: its node record's size and models, and its placement key (None: no key)."""

    engine_id: str
    tp: int = 1
    hardware: str = ""
    hosted: tuple[str, ...] = ()
    desired: tuple[str, ...] | None = None

    @property
    def effective(self) -> tuple[str, ...]:
        """What it is meant to host: its key's models, else (no key: no opinion) what it hosts."""
        return tuple(sorted(self.desired if self.desired is not None else self.hosted))


def live_engines(nodes: Iterable[NodeRecord], placements: Mapping[str, DesiredPlacement]) -> list[LiveEngine]:
    """The engine pool from the node records and the desired placements, by engine id."""
    out = []
    for n in sorted((n for n in nodes if n.role == ENGINE_ROLE), key=lambda n: n.node_id):
        p = placements.get(n.node_id)
        out.append(
            LiveEngine(
                engine_id=n.node_id,
                tp=max(n.tp, 1),
                hardware=n.hardware,
                hosted=tuple(n.models),
                desired=tuple(m.name for m in p.models) if p is not None else None,
            )
        )
    return out


def gpu_pool(
    engines: Sequence[LiveEngine],
    default_hardware: str,
    gpus_per_node: int,
    settings: Mapping[str, Any] | None = None,
) -> tuple[GpuPool, str]:
    """One pool of Σ tp GPUs: the engines' common hardware, else ``default_hardware`` (with a note
    when they disagree or report none). A planner's instance must match an engine's size, so groups
    are at most the largest engine (``gpus_per_node`` is capped by it: tp-1 engines plan tp-1
    instances). ``settings``: the engines' settings a planner prices, as ``GpuPool`` keywords
    (``ClusterConfig.planned_engines``: LoRA slots and rank, limits, memory fraction)."""
    kinds = Counter(e.hardware for e in engines if e.hardware)
    note = ""
    if len(kinds) == 1 and sum(kinds.values()) == len(engines):
        hw = next(iter(kinds))
    else:
        hw = default_hardware
        if kinds:
            note = f"engines report hardware {dict(kinds)}; planning them all as {hw}"
    try:
        hw = hardware(hw).name
    except UnknownHardware:
        note = f"engine hardware {hw!r} is not in the catalog; planning as {default_hardware}"
        hw = default_hardware
    per_node = max(1, min(gpus_per_node, max(e.tp for e in engines)))
    return GpuPool(hw, sum(e.tp for e in engines), per_node, **(settings or {})), note


def planner_loads(
    loads: Iterable[ServiceLoad], services: Sequence[ServiceSpec], names: ModelNames, drain_s: float = 0.0
) -> list[ServiceLoad]:
    """The configured services as a planner sees them: monitored demand (a service the monitor does not
    report has none), SLO from the config, model as its catalog name (an adapter's base, the adapter
    named in ``adapter``); with ``drain_s`` > 0 the requests queued now count as demand too
    (``policies.placement.backlog``: served within ``drain_s``)."""
    seen = {s.name: s for s in loads}
    out = []
    for spec in sorted(services, key=lambda s: s.name):
        load = seen.get(spec.name) or ServiceLoad(spec.name, spec.model)
        adapter = spec.model if names.host(spec.model) != spec.model else ""
        out.append(replace(load, model=names.catalog(spec.model), slo=spec.slo, adapter=adapter))
    return with_backlog(out, drain_s) if drain_s > 0 else out


def infeasible_since(
    totals: Mapping[str, int], seen: dict[str, int], services: Sequence[ServiceSpec], names: ModelNames
) -> dict[str, int]:
    """Per catalog model: requests dispatch found no feasible worker for since the last call, from the
    schedulers' cumulative per-service counts; updates ``seen``. A service seen for the first time
    (a new leader) or whose count fell (a scheduler restarted) sets its baseline and adds nothing."""
    model = {s.name: names.catalog(s.model) for s in services}
    out: dict[str, int] = {}
    for svc, n in totals.items():
        before = seen.get(svc)
        seen[svc] = n
        if before is not None and n > before and svc in model:
            out[model[svc]] = out.get(model[svc], 0) + n - before
    return out


@dataclass(frozen=True)
class PlanResult:
    target: Assignment  # every live engine -> served models
    instances: tuple[InstancePlan, ...]  # the planner's plan (catalog names)
    gpus_in_use: int


def plan_target(
    planner: PlacementPlanner,
    pool: GpuPool,
    loads: Sequence[ServiceLoad],
    engines: Sequence[LiveEngine],
    names: ModelNames,
    context: PlacementContext,
) -> PlanResult:
    """Run the planner and map its instances onto the live engines with the fewest model moves.
    Raises ``PlacementInfeasible`` (or ValueError) when it cannot be done."""
    plan = planner.place(pool, loads, context)
    slots = [
        EngineSlot(
            e.engine_id, e.tp, tuple(names.to_catalog[m] for m in e.effective if m in names.to_catalog)
        )
        for e in engines
    ]
    assigned = assign_plan(plan, slots)
    target = {eid: tuple(sorted(names.served(m) for m in ms)) for eid, ms in assigned.items()}
    return PlanResult(target, tuple(plan), gpus_in_use(assigned, slots))


def current_instances(engines: Sequence[LiveEngine], names: ModelNames) -> tuple[InstancePlan, ...]:
    """The plan in force, as a planner's instances (one per engine meant to host something)."""
    out = []
    for e in engines:
        models = tuple(names.to_catalog[m] for m in e.effective if m in names.to_catalog)
        if models:
            out.append(InstancePlan(e.engine_id, models, e.tp))
    return tuple(out)


def current_state(engines: Sequence[LiveEngine]) -> Assignment:
    return {e.engine_id: e.effective for e in engines}


def uncovered(state: Mapping[str, Sequence[str]], models: Iterable[str]) -> list[str]:
    """The ``models`` no engine of ``state`` is meant to host."""
    hosted = {m for ms in state.values() for m in ms}
    return sorted(set(models) - hosted)


def describe_change(current: Mapping[str, Sequence[str]], target: Mapping[str, Sequence[str]]) -> str:
    """``engine-2: +tiny-llama; engine-3: -tiny-qwen2 (idle)`` (engines whose models change)."""
    parts = []
    for eid in sorted(set(current) | set(target)):
        a, b = set(current.get(eid, ())), set(target.get(eid, ()))
        if a == b:
            continue
        delta = [f"+{m}" for m in sorted(b - a)] + [f"-{m}" for m in sorted(a - b)]
        parts.append(f"{eid}: {' '.join(delta)}{' (idle)' if not b else ''}")
    return "; ".join(parts) or "no change"


def describe_loads(loads: Sequence[ServiceLoad]) -> str:
    """``chat 2.50 rps (SLO met 95%), summarize 0.00 rps``: the demand a plan answered."""
    parts = []
    for s in loads:
        att = f" (SLO met {s.attainment:.0%})" if s.attainment is not None else ""
        parts.append(f"{s.name} {s.rate_rps:.2f} rps{att}")
    return ", ".join(parts) or "no services"
