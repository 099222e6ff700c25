"""The live fleet's loops: the spec sections (:mod:`llmfleet.spec.sections`) with what only a live
process needs (etcd-monitored windows, the pool's hardware, how many moves run at once, readiness) and
the flags ``llmfleet up`` passes to each service.

Where a live default differs from the simulator's (a placement leader runs every 30 s with
hysteresis; the scheduler binds late), the value is in :mod:`llmfleet.spec.defaults` with its reason.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

import llmfleet.spec.defaults as defaults
from llmfleet.costmodel.hardware import UnknownHardware, hardware
from llmfleet.monitor.window import DEFAULT_WINDOWS_S
from llmfleet.policies import placement as placement_policies
from llmfleet.spec.flags import SectionFlags
from llmfleet.spec.sections import CapacitySpec, DispatchSpec, MigrationSpec, PlacementSpec

STATIC_POLICY = defaults.PLACEMENT_POLICY  # the placement policy that copies ``engines:`` into etcd


def placement_policy_names() -> list[str]:
    """Valid ``placement.policy`` values: ``static`` and every planner of the placement registry."""

    return [STATIC_POLICY, *sorted(placement_policies.POLICIES)]


class PlacementConfig(PlacementSpec):
    """The placement leader's loop. ``static`` writes the ``engines:`` lists as they are (no planner);
    any other policy is a planner of ``llmfleet.policies.placement`` run every ``interval_s`` over the
    monitored workload and the live engine pool (``engines:`` then only says which engines
    ``llmfleet up`` starts and with which settings; their ``models`` are ignored)."""

    policy: str = Field(
        STATIC_POLICY,
        description=f"{STATIC_POLICY} (copy the engines: lists into etcd) or a planner of "
        "llmfleet.policies.placement",
    )
    interval_s: float = Field(
        defaults.LIVE_PLACEMENT_INTERVAL_S, gt=0, allow_inf_nan=False, description="seconds between plans"
    )
    confirm_intervals: int = Field(
        defaults.LIVE_PLACEMENT_CONFIRM_INTERVALS,
        ge=1,
        description=PlacementSpec.model_fields["confirm_intervals"].description,
    )
    hardware: str = Field(
        "cpu", description="catalog hardware of the pool when its engines report none (or disagree)"
    )
    gpus_per_node: int = Field(8, ge=1, description="GPUs of one node of the pool (a planner's TP bound)")

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in placement_policy_names():
            raise ValueError(f"unknown placement policy {v!r}; valid: {placement_policy_names()}")
        return v

    @field_validator("window_s")
    @classmethod
    def _window(cls, v: float | None) -> float | None:
        if v is not None and v not in DEFAULT_WINDOWS_S:
            raise ValueError(
                f"window_s must be one of the windows the schedulers report, "
                f"{', '.join(f'{w:g}' for w in DEFAULT_WINDOWS_S)} s; got {v:g}"
            )
        return v

    @field_validator("hardware")
    @classmethod
    def _hardware(cls, v: str) -> str:
        try:
            return hardware(v).name
        except UnknownHardware as e:
            raise ValueError(e.args[0]) from None


class MigrationConfig(MigrationSpec):
    """The migration leader's loop (``llmfleet-migration``; docs/migration.md): its policy
    (``none``, ``mell``, ``llumnix_lb``) and options, epoch, how moves travel, and how many run at once."""

    max_concurrency: int = Field(4, ge=1, description="migrations in flight at once")
    load_interval_s: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="seconds between the engines' load snapshots (WatchLoad)"
    )

    def args(self) -> list[str]:
        """The ``llmfleet-migration`` flags for this section."""
        return MIGRATION_FLAGS.argv(self)


class SchedulerConfig(CapacitySpec):
    """The schedulers: the default dispatch policy with its options (a service may name its own), how
    requests wait for capacity (:class:`~llmfleet.spec.sections.CapacitySpec`), and readiness
    (``llmfleet up`` passes these as ``llmfleet-scheduler`` flags; ``llmfleet sim --cluster-config``
    simulates the same)."""

    dispatch: DispatchSpec = Field(default_factory=DispatchSpec)
    load_interval_s: float = Field(
        0.5,
        gt=0,
        allow_inf_nan=False,
        description="seconds between the engines' load snapshots (WatchLoad) the load monitor reads; "
        "the simulator's dispatch reads the engines' state as it is",
    )
    ready_when: Literal["servable", "started"] = Field(
        "servable",
        description="when the scheduler says SERVING (gRPC health, HTTP /ready): servable = every service "
        "not marked scale_to_zero has an engine with its model loaded; started = at once",
    )

    def args(self) -> list[str]:
        """The ``llmfleet-scheduler`` flags for these settings."""
        return SCHEDULER_FLAGS.argv(self)

    def capacity(self) -> dict[str, Any]:
        """The capacity settings alone (what the simulator runs as well)."""
        return self.model_dump(include=set(CapacitySpec.model_fields))


# each service's flags for its section: llmfleet up writes them (args()), the service parses them
PLACEMENT_FLAGS = SectionFlags(
    PlacementConfig,
    names={"options": "policy-options"},
    overrides=True,
    key="placement",
    title="placement (over the cluster file's placement: section)",
)
MIGRATION_FLAGS = SectionFlags(
    MigrationConfig,
    names={"options": "policy-options"},
    title="migration (the cluster file's migration: section)",
)
SCHEDULER_FLAGS = SectionFlags(
    SchedulerConfig,
    names={"dispatch.policy": "dispatch"},
    title="dispatch and capacity (the cluster file's scheduler: section)",
)
