"""The engines of a cluster file: each engine's local policy with its options and the
:class:`~llmfleet.engine_core.EngineLimits` it sets, or an emulated pool of catalog GPUs.

``block_tokens`` (tokens per merged KV block of the largest model) is the simulator's and the
emulated engines' block size; ``block_bytes`` is a native engine's (its models are loaded at run time,
so its merged block is sized in bytes). They are two settings for two kinds of engine, not two
spellings of one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from llmfleet import renamed
from llmfleet.costmodel.hardware import UnknownHardware, hardware
from llmfleet.costmodel.memory import DEFAULT_MEM_FRACTION
from llmfleet.costmodel.sources import DEFAULT_COST_SOURCE, check_cost_source
from llmfleet.engine_core import EngineLimits
from llmfleet.policies import engine_policy as engine_policies
from llmfleet.spec.defaults import ENGINE_POLICY
from llmfleet.spec.flags import SectionFlags
from llmfleet.spec.sections import EnginePolicySpec, PreemptionSpec
from llmfleet.spec.sizes import ByteSize
from llmfleet.spec.validation import validation_message
from llmfleet.spec.vllm import VllmSettings


def _section(policy: str, options: dict[str, Any]) -> EnginePolicySpec:
    try:
        return EnginePolicySpec(policy=policy, options=options)
    except ValidationError as e:
        raise ValueError(validation_message(e)) from None


_STRICT = ConfigDict(extra="forbid")  # a misspelt key is an error naming it, not silently ignored

# the EngineLimits fields (llmfleet.engine_core) an engines: entry sets
LIMITS = (
    "max_running",
    "max_batch_requests",
    "max_prefill_tokens",
    "watermark",
    "block_tokens",
    "block_bytes",
    "prefix_caching",
)
# what only the native engine core reads: a vLLM engine schedules, batches and pages on its own
NATIVE_ONLY = ("policy", "options", *LIMITS, "stream_interval_s", "threads")
# LoRA settings both backends read (a vLLM engine starts with enable_lora, max_loras, max_lora_rank)
LORA = ("max_loras", "max_lora_rank")
_POLICY = EnginePolicySpec.model_fields


class EngineConfig(BaseModel):
    """One engine: its backend, its models, and for the native backend the local policy with its
    constructor options and the :class:`~llmfleet.engine_core.EngineLimits` it sets (unset: the
    engine's defaults); for the vLLM backend its ``vllm:`` settings. Emulated GPUs are an
    ``emulated:`` pool, not entries here."""

    model_config = _STRICT

    backend: Literal["native", "vllm"] = "native"
    models: list[str] = Field(default_factory=list)
    device: str = "cpu"
    port: int | None = None
    vllm: VllmSettings | None = Field(
        None,
        description='backend vllm: its settings (llmfleet.spec.vllm.VllmSettings), e.g. {"max_model_len": '
        '512, "kv_cache_memory_bytes": "1GiB", "enforce_eager": true} (unset: their defaults)',
    )
    policy: str = Field(ENGINE_POLICY, description=_POLICY["policy"].description)
    options: dict[str, Any] = Field(default_factory=dict, description=_POLICY["options"].description)
    # EngineLimits (llmfleet.engine_core), same names as the simulator's engine settings; unset: the
    # engine's defaults (the native executor's are CPU-sized, the emulated GPUs' the simulator's)
    max_running: int | None = Field(None, ge=1, description="requests holding KV at once")
    max_batch_requests: int | None = Field(None, ge=1, description="requests per iteration")
    max_prefill_tokens: int | None = Field(None, ge=1, description="prompt tokens per prefill batch")
    watermark: float | None = Field(
        None, ge=0, lt=1, description="fraction of the KV pool kept free when admitting requests"
    )
    block_tokens: int | None = Field(
        None, ge=1, description="emulated engines: tokens per merged KV block of the largest model"
    )
    block_bytes: ByteSize | None = Field(
        None,
        ge=16,
        multiple_of=16,
        description="native engines: bytes per merged KV block, e.g. 64KiB (all layers x KV heads x "
        "the tokens of a model that fit)",
    )
    prefix_caching: bool | None = Field(
        None, description="reuse the KV of cached prompt prefixes (unset: on)"
    )
    stream_interval_s: float = Field(
        0.0,
        ge=0,
        description="deliver tokens to streams at most this often; first and final chunks go at once (0: "
        "after every iteration)",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="torch intra-op threads of a CPU engine (unset: llmfleet up shares the host's cores "
        "among the CPU engines it starts, at least one each, so that engines on one host do not "
        "oversubscribe it; a lone engine: torch's default)",
    )

    max_loras: int | None = Field(
        None,
        ge=0,
        description="LoRA adapter slots per base model, all adapters of a base in one batch (unset or 0: "
        "LoRA off; a vLLM engine: its max_loras, with enable_lora)",
    )
    max_lora_rank: int | None = Field(
        None, ge=1, description="the largest LoRA adapter rank the engine serves (unset: 16)"
    )

    @model_validator(mode="before")
    @classmethod
    def _spelling(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("backend") == "emulated":
            raise ValueError(
                "backend: emulated is not an engines: entry; emulated GPUs are the emulated: section "
                "(or llmfleet up --emulate NxHARDWARE), each priced by the simulator's cost model"
            )
        renamed.refuse_renamed(data, renamed.ENGINE)
        return data

    @model_validator(mode="after")
    def _backend_settings(self) -> EngineConfig:
        if self.backend == "native":
            if self.vllm is not None:
                raise ValueError("vllm: settings need backend: vllm")
            return self
        native = sorted(k for k in NATIVE_ONLY if k in self.model_fields_set)
        if native:
            raise ValueError(
                f"{native} apply to the native backend only: a vLLM engine schedules, batches and pages "
                "its KV itself (its settings go under vllm:)"
            )
        return self

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in engine_policies.ENGINE_POLICIES:
            raise ValueError(f"unknown engine policy {v!r}; valid: {list(engine_policies.ENGINE_POLICIES)}")
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "policy" in info.data:  # else the policy itself is the error
            _section(info.data["policy"], v)  # builds the policy: a bad option is named here
        return v

    def policy_spec(self) -> EnginePolicySpec:
        """The engine-local policy section (the simulator runs the same one)."""
        return _section(self.policy, self.options)

    @model_validator(mode="after")
    def _limits(self) -> EngineConfig:
        EngineLimits(**self.limits())  # the engine's own checks
        return self

    def limits(self) -> dict[str, Any]:
        """The :class:`~llmfleet.engine_core.EngineLimits` fields this entry sets."""
        return {k: getattr(self, k) for k in LIMITS if getattr(self, k) is not None}

    def engine_args(self) -> list[str]:
        """``llmfleet-engine`` flags for the backend and its settings: a vLLM engine's ``vllm:``, a
        native one's policy, its options and the limits set here."""
        if self.backend == "vllm":
            return ["--backend", "vllm", *ENGINE_FLAGS.argv(self, only={"vllm", *LORA})]
        return ENGINE_FLAGS.argv(self)


class EmulatedPool(BaseModel):
    """``emulated:``: the engines are emulated GPUs (``llmfleet-engine --backend emulated``): ``count``
    GPUs of catalog ``hardware``, hosted ``count / processes`` per process, each an engine with the
    ``engine`` settings (local policy, options, limits, LoRA slots) and every model served as its catalog
    ``sim_model``. ``llmfleet up --emulate 32xA100-80GB`` sets count and hardware from the command line."""

    model_config = _STRICT

    hardware: str = "a100-80gb"
    count: int = Field(8, ge=1, le=4096)
    processes: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    cost_source: Annotated[str, AfterValidator(check_cost_source)] = Field(
        DEFAULT_COST_SOURCE,
        description="step costs: calibrated, vidur or roofline (llmfleet.costmodel.sources)",
    )
    mem_fraction: float = Field(
        DEFAULT_MEM_FRACTION, gt=0, le=1, description="share of GPU memory for the weights and the KV pool"
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)

    @field_validator("hardware")
    @classmethod
    def _hardware(cls, v: str) -> str:
        try:
            name = hardware(v).name
        except UnknownHardware as e:
            raise ValueError(e.args[0]) from None
        if name == "cpu":
            raise ValueError("an emulated pool emulates a catalog GPU, not cpu")
        return name

    @model_validator(mode="after")
    def _layout(self) -> EmulatedPool:
        if self.processes > self.count:
            raise ValueError(f"processes ({self.processes}) must not exceed count ({self.count})")
        engine = self.engine
        if engine.models or engine.device != "cpu" or engine.port is not None or engine.backend != "native":
            raise ValueError(
                "emulated.engine takes the local policy and limits only (no backend, models, device or port)"
            )
        return self

    def per_process(self) -> list[int]:
        """Engines in each process (as even as the division allows)."""
        q, r = divmod(self.count, self.processes)
        return [q + (i < r) for i in range(self.processes)]


class EnginePreemption(BaseModel):
    """The scheduler section's ``preemption``, with its ``fairness`` resolved by the section's hold-queue
    fairness (:meth:`~llmfleet.spec.sections.PreemptionSpec.resolved`): what ``llmfleet up`` passes
    every native and emulated engine, so that their cores preempt by the rule the schedulers' late
    binding assumes."""

    model_config = _STRICT

    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)


# the engine's flags for its entry (backend, models, device and port are flags of the node) and for
# an emulated pool's cost model (hardware, tp and engines per process likewise)
ENGINE_FLAGS = SectionFlags(
    EngineConfig,
    names={"options": "policy-options", "vllm": "vllm-options"},
    skip={"backend", "models", "device", "port"},
    whole={"vllm"},
    title="engine (the cluster file's engines.<id> entry)",
)
EMULATED_FLAGS = SectionFlags(
    EmulatedPool,
    skip={"hardware", "count", "processes", "tp", "engine"},
    title="emulated backend (--backend emulated; the cluster file's emulated: section)",
)
PREEMPTION_FLAGS = SectionFlags(
    EnginePreemption,
    title="preemption (the cluster file's scheduler.preemption, as llmfleet up passes it)",
)
