"""The pure engine core shared by the live engine and the simulator (schedule → execute → complete)."""

from __future__ import annotations

from llmfleet.engine_core.adapter_slots import AdapterGate, AdapterSlots, AdapterUnavailable, adapter_rows
from llmfleet.engine_core.continuous_stepper import ContinuousStepper
from llmfleet.engine_core.core import EngineCore, stepper_for
from llmfleet.engine_core.limits import EngineLimits
from llmfleet.engine_core.request import CoreRequest, StepEnd, StepPlan, StepResult
from llmfleet.engine_core.static_stepper import StaticStepper
from llmfleet.engine_core.stepper import ChunkablePolicy, RunChargedPolicy, Stepper

__all__ = [
    "AdapterGate",
    "AdapterSlots",
    "AdapterUnavailable",
    "ChunkablePolicy",
    "ContinuousStepper",
    "CoreRequest",
    "EngineCore",
    "EngineLimits",
    "RunChargedPolicy",
    "StaticStepper",
    "StepEnd",
    "StepPlan",
    "StepResult",
    "Stepper",
    "adapter_rows",
    "stepper_for",
]
