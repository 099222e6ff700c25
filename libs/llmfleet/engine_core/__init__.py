"""The pure engine core shared by the live engine and the simulator (schedule → execute → complete)."""

from __future__ import annotations

from llmfleet.engine_core.core import ChunkablePolicy, EngineCore, RunChargedPolicy
from llmfleet.engine_core.limits import EngineLimits
from llmfleet.engine_core.request import CoreRequest, StepPlan, StepResult

__all__ = [
    "ChunkablePolicy",
    "CoreRequest",
    "EngineCore",
    "EngineLimits",
    "RunChargedPolicy",
    "StepPlan",
    "StepResult",
]
