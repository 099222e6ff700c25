"""Placement planning interface for the simulator and the placement controller.

A planner maps a pool of identical GPUs and the services' demand to engine instances: each instance is
``tp`` GPUs (a power of two, within a node) hosting one or more models that share its memory.

Planners are pure: what they read comes in as arguments. ``services`` is the monitored demand
(:class:`ServiceLoad`); a :class:`PlacementContext` carries the rest — the current plan and, for
planners whose :class:`PlacementNeeds` say ``evaluator`` (SeaLLM), a :class:`PlanEvaluator` that scores
candidate plans by simulating the recent workload. The simulator and the live placement leader build
the same context, so both run the same planner objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

from llmfleet.costmodel.memory import DEFAULT_MEM_FRACTION
from llmfleet.engine_core.limits import EngineLimits
from llmfleet.types import Slo


@dataclass(frozen=True)
class GpuPool:
    """``count`` GPUs of one catalog ``hardware`` type, ``gpus_per_node`` per node, and the engines'
    settings that size and count their KV pools: their ``limits`` (block size, watermark, the batch
    limits that size peak activations), ``mem_fraction`` of each GPU for weights and KV, and the LoRA
    adapter pool, ``adapter_slots`` slots per base model (0: LoRA off) of rank up to ``max_lora_rank``
    (an engine with LoRA on reserves that pool beside each base it hosts). ``kv_bytes``, when set, is
    every engine's KV pool whatever it hosts (the simulator's ``EngineSettings.kv_bytes``), in place of
    the ``mem_fraction`` rule."""

    hardware: str
    count: int
    gpus_per_node: int = 8
    adapter_slots: int = 0
    max_lora_rank: int = 16
    limits: EngineLimits = field(default_factory=EngineLimits)
    mem_fraction: float = DEFAULT_MEM_FRACTION
    kv_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.count < 1 or self.gpus_per_node < 1:
            raise ValueError(f"GpuPool needs count >= 1 and gpus_per_node >= 1, got {self}")
        if self.adapter_slots < 0:
            raise ValueError(f"GpuPool.adapter_slots must be >= 0, got {self.adapter_slots}")
        if self.max_lora_rank < 1:
            raise ValueError(f"GpuPool.max_lora_rank must be >= 1, got {self.max_lora_rank}")
        if not 0 < self.mem_fraction <= 1:
            raise ValueError(f"GpuPool.mem_fraction must be in (0, 1], got {self.mem_fraction}")
        if self.kv_bytes is not None and self.kv_bytes <= 0:
            raise ValueError(f"GpuPool.kv_bytes must be > 0 when set, got {self.kv_bytes}")


@dataclass(frozen=True)
class ServiceLoad:
    """A service as a planner sees it: its model (a catalog name; a LoRA adapter's base) and its demand.
    ``adapter`` names the LoRA adapter its requests run on ``model`` ("": the model itself)."""

    name: str
    model: str
    rate_rps: float = 0.0
    mean_prompt_tokens: float = 0.0
    mean_output_tokens: float = 0.0
    std_prompt_tokens: float = 0.0
    std_output_tokens: float = 0.0
    slo: Slo = field(default_factory=Slo)
    attainment: float | None = None  # measured SLO attainment over the window (None: no finished request)
    normalized_latency: float | None = None  # measured mean L_r / L̂_s over the window
    queued: int = 0  # requests not started now (held in schedulers or queued on engines)
    cold: int = 0  # of them, waiting because no engine hosts the model (scale from zero)
    held: int = 0  # of them, held in the schedulers (cold, or every engine saturated)
    adapter: str = ""


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


@dataclass(frozen=True)
class PlanScore:
    """A plan's simulated quality on the recent workload (SeaLLM's M_est).

    Per service: ``violations`` = Σ_r 1[L_r > SLO_s] and ``latency_sum`` = L_N^s = Σ_r L_r / L̂_s, the
    two terms of SeaLLM's unserved index UI_s = violations + α·L_N^s. A request the plan cannot serve
    (no instance hosts its model) is a violation, and its normalized latency is taken as if it waited
    from its arrival to the end of the simulated window.
    """

    slo_attainment: float  # fraction of requests within their SLO, all services
    normalized_latency: float  # mean over requests of L_r / L̂_s
    violations: dict[str, int] = field(default_factory=dict)
    latency_sum: dict[str, float] = field(default_factory=dict)
    requests: int = 0


@runtime_checkable
class PlanEvaluator(Protocol):
    parallelism: int  # plans scored side by side for the price of one (its worker processes)

    def evaluate(self, plans: Sequence[Sequence[InstancePlan]]) -> list[PlanScore]:
        """Score each plan on the recent workload (in parallel where it can), in order."""
        ...

    def close(self) -> None:
        """Release what scoring holds (worker processes); the caller is done with it."""
        ...


@dataclass(frozen=True)
class PlacementNeeds:
    """What a planner reads beyond the pool and the demand (declared by type, checked at build)."""

    evaluator: bool = False  # scores candidate plans by simulation (SeaLLM Algorithm 1)


@dataclass(frozen=True)
class PlacementContext:
    """Inputs a planner may read besides the pool and demand: the plan in force (to keep what works),
    a plan evaluator for the planners that need one, and dispatch's infeasible counts."""

    current: tuple[InstancePlan, ...] = ()
    evaluator: PlanEvaluator | None = None
    now: float = 0.0
    # per model: requests that best-fit dispatch found no feasible worker for since the last plan
    # (Aladdin scales out on them)
    infeasible: dict[str, int] = field(default_factory=dict)


class PlannerReport:
    """What every planner tells about its last plan (read by the simulator's loop and the live
    leader's decision log): why it chose it and, when it simulated it, its score (SeaLLM's M_est)."""

    last_reason: str = ""
    last_score: PlanScore | None = None


class PlacementPlanner(Protocol):
    name: str
    needs: ClassVar[PlacementNeeds]
    last_reason: str
    last_score: PlanScore | None

    def place(
        self, gpus: GpuPool, services: Sequence[ServiceLoad], context: PlacementContext | None = None
    ) -> list[InstancePlan]:
        """Instances using at most ``gpus.count`` GPUs; raises PlacementInfeasible when impossible."""
        ...
