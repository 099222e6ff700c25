"""Emulated GPUs: the native engine's request path on catalog hardware priced by the simulator's cost
model (``llmfleet-engine --backend emulated``), and a host that runs many of them in one process."""

from llmfleet_engine.emulated.config import EmulatedConfig
from llmfleet_engine.emulated.executor import EmulatedExecutor, StepPricer

__all__ = ["EmulatedConfig", "EmulatedExecutor", "StepPricer"]
