"""Placement policies: which engine hosts which models."""

from __future__ import annotations

from typing import Any

from llmfleet.policies.placement.aladdin_workers import AladdinWorkers, optimal_tp
from llmfleet.policies.placement.base import (
    GpuPool,
    InstancePlan,
    PlacementInfeasible,
    PlacementPlanner,
    ServiceLoad,
)
from llmfleet.policies.placement.colocate_all import ColocateAll
from llmfleet.policies.placement.dedicated_even import DedicatedEven
from llmfleet.policies.placement.static_config import StaticConfigPlacement

# planners with the PlacementPlanner interface (StaticConfigPlacement replays a config instead)
POLICIES: dict[str, type] = {
    "dedicated_even": DedicatedEven,
    "colocate_all": ColocateAll,
    "aladdin_workers": AladdinWorkers,
}


def make_placement_policy(name: str, **kwargs: Any) -> PlacementPlanner:
    """A new placement planner by registry name; options go to its constructor."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; valid: {sorted(POLICIES)}") from None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad options for placement policy {name!r}: {e}") from None


__all__ = [
    "POLICIES",
    "AladdinWorkers",
    "ColocateAll",
    "DedicatedEven",
    "GpuPool",
    "InstancePlan",
    "PlacementInfeasible",
    "PlacementPlanner",
    "ServiceLoad",
    "StaticConfigPlacement",
    "make_placement_policy",
    "optimal_tp",
]
