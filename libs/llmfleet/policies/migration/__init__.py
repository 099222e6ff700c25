"""Migration policies: which running requests move where each epoch (Mell's packing, Llumnix-style
balancing, none) and how each move travels (hybrid KV / token transfer)."""

from __future__ import annotations

from typing import Any

from llmfleet.policies.migration.base import (
    EpochPlan,
    GpuState,
    Migration,
    MigrationPolicy,
    RequestState,
    TransferBudget,
    TransferMode,
    TransferPlanner,
    migration_id,
)
from llmfleet.policies.migration.hybrid_transfer import (
    HybridTransfer,
    KvOnly,
    TokensOnly,
    communication_boundary,
    computation_boundary,
    reprefill_boundary,
)
from llmfleet.policies.migration.llumnix_lb import LlumnixBalance, LlumnixOptions
from llmfleet.policies.migration.mell import MellOptions, MellPacker, MellView, allocate_target
from llmfleet.policies.migration.mell_classes import gpu_type
from llmfleet.policies.migration.none import NoMigration
from llmfleet.policies.registry import instantiate

POLICIES: dict[str, type] = {
    "mell": MellPacker,
    "llumnix_lb": LlumnixBalance,
    "none": NoMigration,
}

TRANSFERS: dict[str, type] = {
    "hybrid": HybridTransfer,
    "kv": KvOnly,
    "tokens": TokensOnly,
}


def make_migration_policy(name: str, **kwargs: Any) -> MigrationPolicy:
    """A new migration policy by registry name with its options record built from ``kwargs``."""
    return instantiate("migration", POLICIES, name, kwargs)


def make_transfer_planner(name: str, **kwargs: Any) -> TransferPlanner:
    """A transfer planner by name: ``hybrid`` (Mell), ``kv`` (KV only), ``tokens`` (re-prefill only)."""
    return instantiate("transfer", TRANSFERS, name, kwargs)


__all__ = [
    "POLICIES",
    "TRANSFERS",
    "EpochPlan",
    "GpuState",
    "HybridTransfer",
    "KvOnly",
    "LlumnixBalance",
    "LlumnixOptions",
    "MellOptions",
    "MellPacker",
    "MellView",
    "Migration",
    "MigrationPolicy",
    "NoMigration",
    "RequestState",
    "TokensOnly",
    "TransferBudget",
    "TransferMode",
    "TransferPlanner",
    "allocate_target",
    "communication_boundary",
    "computation_boundary",
    "gpu_type",
    "make_migration_policy",
    "make_transfer_planner",
    "migration_id",
    "reprefill_boundary",
]
