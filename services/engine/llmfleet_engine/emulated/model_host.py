"""The emulated engine's model host: a catalog architecture instead of weights, the simulator's memory
footprint and load time, and a step pricer (the cost model) standing where a model's forward runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmfleet.costmodel import CostBook, LinearCost, ModelArch
from llmfleet.costmodel import memory as cost_memory
from llmfleet.costmodel.lora import LoraCost, adapter_pool_bytes
from llmfleet.engine_core import StepPlan, adapter_rows
from llmfleet.kvblocks import KvShape
from llmfleet.types import ModelSpec

from llmfleet_engine.emulated.adapters import EmulatedAdapterPool
from llmfleet_engine.emulated.catalog import emulated_model, resolve_arch
from llmfleet_engine.emulated.clock import WallClock
from llmfleet_engine.model_host import ModelHost
from llmfleet_engine.models import LoadedModel

if TYPE_CHECKING:
    from llmfleet_engine.emulated.config import EmulatedConfig


@dataclass(frozen=True)
class StepPricer:
    """An emulated model's "forward": the cost model of its catalog architecture at the engine's TP,
    plus, with an adapter pool (``lora``), its adapter rows' matmuls and the adapter loads the step
    waited for (as the simulator's instance charges them)."""

    cost: LinearCost
    lora: EmulatedAdapterPool | None = None

    def step_s(self, plan: StepPlan) -> float:
        base = self.cost.iteration(plan.prefill_tokens, plan.prefill_sq, plan.decodes, plan.context_tokens)
        if self.lora is None:
            return base
        tokens, adapters = adapter_rows(plan)
        extra = self.lora.cost.batch_seconds(tokens, adapters) if adapters else 0.0
        return base + (self.lora.take_load_debt() + extra)  # summed as the simulator sums them


@dataclass(eq=False)
class EmulatedHost(ModelHost):
    """The native model host over catalog architectures: no tensors, the cost model's load time."""

    config: EmulatedConfig
    clock: WallClock

    def _materialize(self, spec: ModelSpec) -> LoadedModel:
        arch = resolve_arch(spec, self.config.sim_models)
        return emulated_model(spec, arch, self.pool.device, self.config.tp)

    def _footprint(self, loaded: LoadedModel) -> tuple[KvShape, int]:
        arch: ModelArch = loaded.model
        cfg = self.config
        activation = cost_memory.activation_bytes(arch, cfg.max_prefill_tokens, cfg.max_batch_requests)
        adapters = adapter_pool_bytes(arch, cfg.max_loras, cfg.max_lora_rank)  # 0 with LoRA off
        return arch.kv_shape, arch.weight_bytes + activation + adapters

    def _new_runner(self, loaded: LoadedModel) -> StepPricer:
        arch: ModelArch = loaded.model
        cfg = self.config
        book = CostBook.build(cfg.hw, {arch.name: arch}, source=cfg.cost_source)
        lora = None
        if cfg.max_loras:
            cost = LoraCost(arch, cfg.hw, cfg.tp, cfg.max_lora_rank)
            lora = EmulatedAdapterPool(cfg.max_loras, cfg.max_lora_rank, cost)
        return StepPricer(book.model(arch.name, cfg.tp), lora)

    def _weights_arrive(self, loaded: LoadedModel) -> None:
        """The simulator's load time: the weights over the GPUs' host links."""
        start = self.clock.monotonic()
        self.clock.sleep_until(
            start + cost_memory.load_seconds([loaded.model], self.config.hw, self.config.tp)
        )

    def free_memory(self) -> None:
        pass  # nothing was allocated
