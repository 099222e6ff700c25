"""Placement policies: which engine hosts which models."""

from __future__ import annotations

from typing import Any

from llmfleet.policies.placement.adaptive_interval import AdaptiveInterval, performance
from llmfleet.policies.placement.aladdin import AladdinOptions, AladdinPlanner
from llmfleet.policies.placement.aladdin_workers import AladdinWorkers, AladdinWorkersOptions, optimal_tp
from llmfleet.policies.placement.assign import EngineSlot, assign_plan, gpus_in_use, moves
from llmfleet.policies.placement.base import (
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementInfeasible,
    PlacementNeeds,
    PlacementPlanner,
    PlanEvaluator,
    PlannerReport,
    PlanScore,
    ServiceLoad,
)
from llmfleet.policies.placement.colocate_all import ColocateAll
from llmfleet.policies.placement.dedicated_even import DedicatedEven
from llmfleet.policies.placement.device_topology import Device, LayeredModel, Topology, layered_model
from llmfleet.policies.placement.helr import HelrOptions, HelrPlan, HelrPlanner
from llmfleet.policies.placement.seallm import SeaLLMOptions, SeaLLMPlacement
from llmfleet.policies.placement.static_config import StaticConfigPlacement
from llmfleet.policies.registry import instantiate

# planners with the PlacementPlanner interface (StaticConfigPlacement replays a config instead)
POLICIES: dict[str, type] = {
    "dedicated_even": DedicatedEven,
    "colocate_all": ColocateAll,
    "aladdin_workers": AladdinWorkers,
    "aladdin": AladdinPlanner,
    "seallm": SeaLLMPlacement,
}


def make_placement_policy(name: str, **kwargs: Any) -> PlacementPlanner:
    """A new placement planner by registry name with its options record built from ``kwargs``."""
    return instantiate("placement", POLICIES, name, kwargs)


__all__ = [
    "POLICIES",
    "AdaptiveInterval",
    "AladdinOptions",
    "AladdinPlanner",
    "AladdinWorkers",
    "AladdinWorkersOptions",
    "ColocateAll",
    "DedicatedEven",
    "Device",
    "EngineSlot",
    "GpuPool",
    "HelrOptions",
    "HelrPlan",
    "HelrPlanner",
    "InstancePlan",
    "LayeredModel",
    "PlacementContext",
    "PlacementInfeasible",
    "PlacementNeeds",
    "PlacementPlanner",
    "PlanEvaluator",
    "PlanScore",
    "PlannerReport",
    "SeaLLMOptions",
    "SeaLLMPlacement",
    "ServiceLoad",
    "StaticConfigPlacement",
    "Topology",
    "assign_plan",
    "gpus_in_use",
    "layered_model",
    "make_placement_policy",
    "moves",
    "optimal_tp",
    "performance",
]
