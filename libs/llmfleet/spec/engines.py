"""The engines of a cluster file: each engine's local policy with its options and the
:class:`~llmfleet.engine_core.EngineLimits` it sets, or an emulated pool of catalog GPUs.

``block_tokens`` (tokens per merged KV block of the largest model) is the simulator's and the
emulated engines' block size; ``block_bytes`` is a native engine's (its models are loaded at run time,
so its merged block is sized in bytes). They are two settings for two kinds of engine, not two
spellings of one.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from llmfleet.costmodel.sources import DEFAULT_COST_SOURCE, check_cost_source
from llmfleet.spec import renamed
from llmfleet.spec.defaults import ENGINE_POLICY
from llmfleet.spec.sections import EnginePolicySpec
from llmfleet.spec.validation import validation_message
from llmfleet.spec.vllm import VllmSettings


def _section(policy: str, options: dict[str, Any]) -> EnginePolicySpec:
    try:
        return EnginePolicySpec(policy=policy, options=options)
    except ValidationError as e:
        raise ValueError(validation_message(e)) from None


_STRICT = ConfigDict(extra="forbid")  # a misspelt key is an error naming it, not silently ignored

# EngineLimits field -> the engine's flag (block_tokens: the simulator's and emulated engines' size)
ENGINE_LIMIT_FLAGS: dict[str, str | None] = {
    "max_running": "--max-running",
    "max_batch_requests": "--max-batch-requests",
    "max_prefill_tokens": "--max-prefill-tokens",
    "watermark": "--watermark",
    "block_bytes": "--block-bytes",
    "block_tokens": None,
    "prefix_caching": "--prefix-caching",
}


def flag_value(value: object) -> str:
    """A limit's value on the engine's command line (a switch is ``on`` or ``off``)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


# what only the native engine core reads: a vLLM engine schedules, batches and pages on its own
NATIVE_ONLY = ("policy", "options", *ENGINE_LIMIT_FLAGS, "stream_interval_s", "threads")


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
    vllm: VllmSettings | None = None  # backend: vllm (unset: VllmSettings' defaults)
    policy: str = ENGINE_POLICY  # engine-local policy: a request policy or a static batcher (static mode)
    # the policy's constructor options, e.g. {batch_size: 8, max_iterations: 64}; static batchers also
    # take slice_end (keep, the default, or recompute = the papers' static mode: padded rows)
    options: dict[str, Any] = Field(default_factory=dict)
    # EngineLimits (llmfleet.engine_core), same names as the simulator's engine settings
    max_running: int | None = Field(None, ge=1)
    max_batch_requests: int | None = Field(None, ge=1)
    max_prefill_tokens: int | None = Field(None, ge=1)
    watermark: float | None = Field(None, ge=0, lt=1)
    block_tokens: int | None = Field(None, ge=1)
    block_bytes: int | None = Field(None, ge=16, multiple_of=16)
    prefix_caching: bool | None = None  # reuse the KV of cached prompt prefixes (unset: on)
    # deliver tokens to streams at most this often (first and final chunks at once; 0 = every iteration)
    stream_interval_s: float | None = Field(None, ge=0)
    # torch intra-op threads of a CPU engine (unset: `llmfleet up` shares the host's cores among the
    # CPU engines it starts, at least one each, so that engines on one host do not oversubscribe it)
    threads: int | None = Field(None, ge=1)

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
        from llmfleet.policies.engine_policy import ENGINE_POLICIES

        if v not in ENGINE_POLICIES:
            raise ValueError(f"unknown engine policy {v!r}; valid: {list(ENGINE_POLICIES)}")
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
        from llmfleet.engine_core import EngineLimits

        EngineLimits(**self.limits())  # the engine's own checks
        return self

    def limits(self) -> dict[str, Any]:
        """The :class:`~llmfleet.engine_core.EngineLimits` fields this entry sets."""
        return {k: getattr(self, k) for k in ENGINE_LIMIT_FLAGS if getattr(self, k) is not None}

    def engine_args(self) -> list[str]:
        """``llmfleet-engine`` flags for the backend and, on the native one, the policy, its options
        and the limits set here."""
        if self.backend == "vllm":
            settings = self.vllm or VllmSettings()
            return ["--backend", "vllm", "--vllm-options", settings.model_dump_json(exclude_defaults=True)]
        argv = ["--policy", self.policy]
        if self.options:
            argv += ["--policy-options", json.dumps(self.options, sort_keys=True)]
        for key, value in self.limits().items():
            flag = ENGINE_LIMIT_FLAGS[key]
            if flag is not None:
                argv += [flag, flag_value(value)]
        if self.stream_interval_s is not None:
            argv += ["--stream-interval-s", str(self.stream_interval_s)]
        if self.threads is not None:
            argv += ["--threads", str(self.threads)]
        return argv


class EmulatedPool(BaseModel):
    """``emulated:``: the engines are emulated GPUs (``llmfleet-engine --backend emulated``): ``count``
    GPUs of catalog ``hardware``, hosted ``count / processes`` per process, each an engine with the
    ``engine`` settings (local policy, options, limits) and every model served as its catalog
    ``sim_model``. ``llmfleet up --emulate 32xA100-80GB`` sets count and hardware from the command line."""

    model_config = _STRICT

    hardware: str = "a100-80gb"
    count: int = Field(8, ge=1, le=4096)
    processes: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    cost_source: str = DEFAULT_COST_SOURCE
    mem_fraction: float = Field(0.9, gt=0, le=1)
    engine: EngineConfig = Field(default_factory=EngineConfig)

    @field_validator("hardware")
    @classmethod
    def _hardware(cls, v: str) -> str:
        from llmfleet.costmodel.hardware import UnknownHardware, hardware

        try:
            name = hardware(v).name
        except UnknownHardware as e:
            raise ValueError(e.args[0]) from None
        if name == "cpu":
            raise ValueError("an emulated pool emulates a catalog GPU, not cpu")
        return name

    @field_validator("cost_source")
    @classmethod
    def _cost_source(cls, v: str) -> str:
        return check_cost_source(v)

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
