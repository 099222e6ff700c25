"""Placement planning interface for the simulator and the placement controller.

A planner maps a pool of identical GPUs and the services' demand to engine instances: each instance is
``tp`` GPUs (a power of two, within a node) hosting one or more models that share its memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GpuPool:
    """``count`` GPUs of one catalog ``hardware`` type, ``gpus_per_node`` per node."""

    hardware: str
    count: int
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        if self.count < 1 or self.gpus_per_node < 1:
            raise ValueError(f"GpuPool needs count >= 1 and gpus_per_node >= 1, got {self}")


@dataclass(frozen=True)
class ServiceLoad:
    """A service as a planner sees it: its model (a catalog name) and its demand."""

    name: str
    model: str
    rate_rps: float = 0.0
    mean_prompt_tokens: float = 0.0
    mean_output_tokens: float = 0.0


@dataclass(frozen=True)
class InstancePlan:
    """One engine instance: ``tp`` GPUs hosting ``models`` (all resident, sharing one KV pool)."""

    instance_id: str
    models: tuple[str, ...]
    tp: int = 1

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError(f"instance {self.instance_id!r} hosts no model")
        if self.tp < 1 or self.tp & (self.tp - 1):
            raise ValueError(f"tp must be a power of two >= 1, got {self.tp} for {self.instance_id!r}")


class PlacementInfeasible(ValueError):
    """The services cannot be placed on the pool (say which and why)."""


class PlacementPlanner(Protocol):
    name: str

    def place(self, gpus: GpuPool, services: Sequence[ServiceLoad]) -> list[InstancePlan]:
        """Instances using at most ``gpus.count`` GPUs; raises PlacementInfeasible when impossible."""
        ...
