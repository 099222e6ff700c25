"""A policy bundle: one simulated system, named, built from the spec sections a cluster file holds.

``PolicyBundle(name, placement, dispatch, engine, migration=..., capacity=...)``; each section is a
:mod:`llmfleet.spec` section, a mapping of its fields, or its policy name alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from llmfleet.policies.batching import StaticBatchPolicy
from llmfleet.policies.engine_policy import make_engine_policy
from llmfleet.policies.request import RequestPolicy
from llmfleet.spec import (
    CapacitySpec,
    DispatchSpec,
    EnginePolicySpec,
    FleetPolicies,
    MigrationSpec,
    PlacementSpec,
)
from llmfleet.spec.defaults import SIM_BINDING
from llmfleet.spec.validation import validation_message
from pydantic import BaseModel, ValidationError

FIRST_PLANS = ("oracle", "cold")

_SECTIONS: dict[str, type[BaseModel]] = {
    "engine": EnginePolicySpec,
    "dispatch": DispatchSpec,
    "placement": PlacementSpec,
    "migration": MigrationSpec,
    "capacity": CapacitySpec,
}
_NAMES = {cls: name for name, cls in _SECTIONS.items()}
S = TypeVar("S", bound=BaseModel)


def section(cls: type[S], value: Any, updates: Mapping[str, Any] | None = None) -> S:
    """``value`` (a section, a mapping, a policy name or None for the default) as a ``cls`` section,
    with ``updates`` applied (and checked)."""
    if value is None:
        data: dict[str, Any] = {}
    elif isinstance(value, cls):
        data = value.model_dump()
    elif isinstance(value, str):
        data = {"policy": value}
    elif isinstance(value, Mapping):
        data = dict(value)
    else:
        raise ValueError(f"{cls.__name__}: expected a section, a mapping or a policy name, got {value!r}")
    data.update(updates or {})
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        name, msg = _NAMES.get(cls, cls.__name__), validation_message(e)
        located = len(e.errors()) == 1 and e.errors()[0]["loc"]
        raise ValueError(f"{name}.{msg}" if located else f"{name}: {msg}") from None


@dataclass(frozen=True, init=False)
class PolicyBundle:
    """One simulated system: the spec sections (:class:`llmfleet.spec.FleetPolicies`) it runs, its name,
    and the plan in force at the start (``first_plan``: "oracle" = planned on the workload's own demand;
    "cold" = as a live leader starts, with no request seen yet)."""

    name: str
    placement: PlacementSpec
    dispatch: DispatchSpec
    engine: EnginePolicySpec
    migration: MigrationSpec
    capacity: CapacitySpec
    description: str
    first_plan: str

    def __init__(
        self,
        name: str,
        placement: PlacementSpec | Mapping[str, Any] | str | None = None,
        dispatch: DispatchSpec | Mapping[str, Any] | str | None = None,
        engine: EnginePolicySpec | Mapping[str, Any] | str | None = None,
        migration: MigrationSpec | Mapping[str, Any] | str | None = None,
        capacity: CapacitySpec | Mapping[str, Any] | None = None,
        description: str = "",
        first_plan: str = "oracle",
    ) -> None:
        given: dict[str, object] = {
            "placement": placement, "dispatch": dispatch, "engine": engine, "migration": migration,
            "capacity": capacity if capacity is not None else {"binding": SIM_BINDING},
        }  # fmt: skip
        for key, cls in _SECTIONS.items():
            object.__setattr__(self, key, section(cls, given[key]))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "first_plan", first_plan)
        self.validate()

    @classmethod
    def of(cls, name: str, policies: FleetPolicies, **kw: Any) -> PolicyBundle:
        """The bundle running ``policies`` (e.g. a cluster file's, :meth:`llmfleet.config.ClusterConfig.policies`)."""
        return cls(name, policies.placement, policies.dispatch, policies.engine, policies.migration,
                   policies.capacity, **kw)  # fmt: skip

    def with_overrides(self, **sections: Any) -> PolicyBundle:
        """A copy with each given section replaced (a section or a policy name) or, for a mapping,
        updated field by field; None leaves a section as it is."""
        kw: dict[str, Any] = {"description": self.description, "first_plan": self.first_plan}
        for key, cls in _SECTIONS.items():
            value = sections.pop(key, None)
            current = getattr(self, key)
            kw[key] = section(cls, current, value) if isinstance(value, Mapping) else (value or current)
        for key in ("description", "first_plan"):
            value = sections.pop(key, None)
            kw[key] = kw[key] if value is None else value
        if sections:
            raise TypeError(
                f"unknown sections {sorted(sections)}; valid: {[*_SECTIONS, 'description', 'first_plan']}"
            )
        return PolicyBundle(self.name, **kw)

    @property
    def central(self) -> bool:
        """``dispatch`` is a central mode (``scls_central``): a central pool batched and offloaded every
        interval (options in ``dispatch.options``); the instances run its batches with the static engine
        core and the engine policy is not used."""
        return self.dispatch.central

    def validate(self) -> None:
        """What no single section can check: how the sections combine."""
        if self.central and (self.placement.interval_s is not None or self.migration.runs):
            raise ValueError(
                f"dispatch {self.dispatch.policy!r} runs on a fixed plan (no placement loop, no migration)"
            )
        if self.placement.policy == "static":
            raise ValueError(
                "placement 'static' copies a live cluster's engines: lists; the simulator plans its GPU pool: "
                "choose a planner (e.g. dedicated_even)"
            )
        if self.first_plan not in FIRST_PLANS:
            raise ValueError(f"unknown first_plan {self.first_plan!r}; valid: {list(FIRST_PLANS)}")
        if self.capacity.binding == "late" and self.central:
            raise ValueError(
                f"binding late holds requests for dispatch; {self.dispatch.policy!r} batches centrally"
            )

    def local_factory(self) -> Callable[[], RequestPolicy | StaticBatchPolicy]:
        """A fresh engine-local policy per instance, built as a live engine builds it
        (:func:`~llmfleet.policies.engine_policy.make_engine_policy`: a static batcher with
        ``slice_end: recompute`` runs on the static stepper, with ``keep`` over continuous batching)."""

        return lambda: make_engine_policy(self.engine.policy, **self.engine.options)

    def to_dict(self) -> dict[str, Any]:
        """The report's ``policy`` entry: the name and each section's fields."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "first_plan": self.first_plan,
        }
        out.update({key: getattr(self, key).model_dump() for key in _SECTIONS})
        return out
