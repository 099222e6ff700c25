"""One spec for the live fleet and the simulator: the shared defaults, and the policy sections a
cluster file holds (engine, dispatch, placement, migration, capacity) with one spelling each.

The live config (:class:`llmfleet.config.ClusterConfig`) embeds these sections; ``llmfleet sim
--cluster-config`` reads the same file into the same sections
(:meth:`llmfleet.config.ClusterConfig.policies`), so both sides build the same policy objects with the same options.
"""

from llmfleet.spec.sections import (
    CapacitySpec,
    DispatchSpec,
    EnginePolicySpec,
    FleetPolicies,
    MigrationSpec,
    PlacementSpec,
)

__all__ = [
    "CapacitySpec",
    "DispatchSpec",
    "EnginePolicySpec",
    "FleetPolicies",
    "MigrationSpec",
    "PlacementSpec",
]
