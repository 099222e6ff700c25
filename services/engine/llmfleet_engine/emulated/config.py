"""The emulated engine's configuration: the executor's knobs plus the emulated GPU."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llmfleet.costmodel import DEFAULT_COST_SOURCE, MODEL_CATALOG, Hardware, check_cost_source, hardware
from llmfleet.costmodel import memory as cost_memory

from llmfleet_engine.emulated.catalog import check_sim_models
from llmfleet_engine.emulated.pacing import DEFAULT_MAX_CATCHUP_S
from llmfleet_engine.executor_config import ExecutorConfig

BACKEND = "emulated"


@dataclass(frozen=True)
class EmulatedConfig(ExecutorConfig):
    """The executor's knobs plus the emulated GPU: catalog ``hardware`` × ``tp``, the memory fraction,
    the cost source and the models' catalog architectures (name -> catalog name). ``block_bytes``
    None: ``block_tokens`` tokens of the largest declared model (every catalog model if none is).
    The limits default to the simulator's (vLLM's GPU defaults), not the CPU executor's.
    ``max_catchup_s``: how far behind the wall clock a step may start on the modelled clock
    (:mod:`.pacing`)."""

    hardware: str = "a100-80gb"
    tp: int = 1
    mem_fraction: float = cost_memory.DEFAULT_MEM_FRACTION
    cost_source: str = DEFAULT_COST_SOURCE
    sim_models: Mapping[str, str] = field(default_factory=dict)
    link_bytes_per_s: float | None = None  # KV transfers (None: the GPU's intra-node link × comm_eff)
    block_bytes: int | None = None
    max_batch_requests: int = cost_memory.DEFAULT_MAX_BATCH_REQUESTS
    max_prefill_tokens: int = cost_memory.DEFAULT_MAX_PREFILL_TOKENS
    max_catchup_s: float = DEFAULT_MAX_CATCHUP_S
    device: str = BACKEND

    def __post_init__(self) -> None:
        hw = hardware(self.hardware)  # UnknownHardware lists the catalog
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if not 0 < self.mem_fraction <= 1:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        check_cost_source(self.cost_source)
        if self.max_catchup_s < 0:
            raise ValueError(f"max_catchup_s must be >= 0, got {self.max_catchup_s}")
        if self.link_bytes_per_s is not None and self.link_bytes_per_s <= 0:
            raise ValueError(f"link_bytes_per_s must be > 0, got {self.link_bytes_per_s}")
        archs = check_sim_models(self.sim_models)
        if self.block_bytes is None:
            largest = max(a.kv_bytes_per_token for a in (archs or MODEL_CATALOG).values())
            object.__setattr__(self, "block_bytes", -(-self.block_tokens * largest // 16) * 16)
        object.__setattr__(self, "hardware", hw.name)
        super().__post_init__()

    @property
    def hw(self) -> Hardware:
        return hardware(self.hardware)

    @property
    def link_bw(self) -> float:
        hw = self.hw
        return self.link_bytes_per_s or hw.intra_node_bw * hw.comm_eff
