"""No migration: dispatch alone places requests (Mell §VII's BF and WF baselines: best-fit or
worst-fit dispatch, no migration; GPUs open when no GPU can take a request and close when idle, which
the dispatcher/scaler does, not this policy)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmfleet.policies.migration.base import EpochPlan, GpuState

__all__ = ["NoMigration"]


@dataclass(frozen=True)
class NoMigration:
    """Implements ``MigrationPolicy``: every epoch's plan is empty (no moves, no (de)activation)."""

    def epoch(self, gpus: Sequence[GpuState], now: float) -> EpochPlan:
        return EpochPlan()
