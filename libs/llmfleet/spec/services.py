"""The services and models of a cluster file (live and simulated read the same keys).

A service names its model, its :class:`~llmfleet.types.Slo`, its priority and ``max_tokens`` (the
output cap of a request that sets none, default :data:`llmfleet.spec.defaults.DEFAULT_MAX_TOKENS`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from llmfleet.spec.defaults import DEFAULT_MAX_TOKENS
from llmfleet.spec.legacy import renamed
from llmfleet.spec.sections import DispatchSpec
from llmfleet.spec.validation import validation_message
from llmfleet.types import DEFAULT_SLO, Slo

_STRICT = ConfigDict(extra="forbid")  # a misspelt key is an error naming it, not silently ignored


class SloConfig(BaseModel):
    """A service's :class:`~llmfleet.types.Slo`; unset ``ttft_s``/``tpot_s`` take the live defaults."""

    model_config = _STRICT

    ttft_s: float = Field(DEFAULT_SLO.ttft_s, gt=0, allow_inf_nan=False)
    tpot_s: float = Field(DEFAULT_SLO.tpot_s, gt=0, allow_inf_nan=False)  # = Aladdin's ATGT
    latency_scale: float = Field(DEFAULT_SLO.latency_scale, gt=0, allow_inf_nan=False)  # SeaLLM
    deadline_s: float | None = Field(None, gt=0, allow_inf_nan=False)  # UELLM (None: no deadline)

    @model_validator(mode="before")
    @classmethod
    def _aladdin_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "atgt_s" in data:
            raise ValueError("atgt_s (Aladdin's average token generation time) is written tpot_s here")
        return data

    def to_slo(self) -> Slo:
        return Slo(**self.model_dump())


class ServiceConfig(BaseModel):
    model_config = _STRICT

    model: str
    slo: SloConfig = Field(default_factory=SloConfig)
    priority: int = 0
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, gt=0)  # the output cap of a request that sets none
    # the service's own dispatch policy ("" = the scheduler's, with scheduler.dispatch.options), and its
    # constructor options; also written as one section, dispatch: {policy: jsq, options: {...}}
    dispatch: str = ""
    dispatch_options: dict[str, Any] = Field(default_factory=dict)
    # predict output lengths before dispatch (for engines whose static batcher orders by length);
    # dispatch policies that read predictions get them regardless
    predict: bool = False
    # admission bounds; 0 = the scheduler's --max-waiting / --max-queued-tokens
    max_waiting: int = Field(0, ge=0)
    max_queued_tokens: int = Field(0, ge=0)
    # scale from zero: how long a request for this service's model waits for an engine to load it
    # (0: min(10 x slo.ttft_s, 120 s)); past it UNAVAILABLE with a retry-after
    cold_start_timeout_s: float = Field(0.0, ge=0.0)
    # no engine needs to host it: the scheduler is ready (and `llmfleet up` done) without it
    scale_to_zero: bool = False

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "deadline_s" in data:
            raise ValueError("deadline_s is part of the SLO now: write slo: {deadline_s: ...}")
        if isinstance(data, dict) and isinstance(data.get("dispatch"), dict):  # the section spelling
            section = dict(data["dispatch"])
            unknown = set(section) - {"policy", "options"}
            if unknown:
                raise ValueError(f"dispatch: unknown keys {sorted(unknown)}; valid: ['options', 'policy']")
            if "dispatch_options" in data:
                raise ValueError("dispatch: give the options in the section or as dispatch_options, not both")
            data = {
                **data,
                "dispatch": section.get("policy", ""),
                "dispatch_options": section.get("options") or {},
            }
        return renamed(data, "default_max_tokens", "max_tokens", "services.<name>")

    @property
    def default_max_tokens(self) -> int:
        """``max_tokens`` under the runtime :class:`~llmfleet.types.ServiceSpec`'s name."""
        return self.max_tokens

    @field_validator("dispatch")
    @classmethod
    def _dispatch(cls, v: str) -> str:
        from llmfleet.policies.dispatch import POLICIES, SCHEDULER_MODES

        if v and v not in POLICIES and v not in SCHEDULER_MODES:
            raise ValueError(f"unknown dispatch policy {v!r}; valid: {sorted([*POLICIES, *SCHEDULER_MODES])}")
        return v

    @model_validator(mode="after")
    def _dispatch_options(self) -> ServiceConfig:
        """Options are checked by building the policy with them (a bad one is named); the scheduler's
        default policy takes ``scheduler.dispatch.options`` instead."""
        if not self.dispatch_options:
            return self
        if not self.dispatch:
            raise ValueError(
                "dispatch_options needs the service's own dispatch policy (dispatch: ...); the "
                "scheduler's default policy takes scheduler.dispatch.options"
            )
        try:
            DispatchSpec(policy=self.dispatch, options=self.dispatch_options)
        except ValidationError as e:
            raise ValueError(f"dispatch_options: {validation_message(e)}") from None
        except (ValueError, TypeError) as e:
            raise ValueError(f"dispatch_options: {e}") from None
        return self


class ModelConfig(BaseModel):
    model_config = _STRICT

    source: str
    dtype: str = "float32"
    # the cost-model catalog name `llmfleet sim --cluster-config` simulates this model as
    # (default: the model's own name, when it is a catalog name)
    sim_model: str | None = None

    @field_validator("sim_model")
    @classmethod
    def _sim_model(cls, v: str | None) -> str | None:
        if v is not None:
            from llmfleet.costmodel import UnknownModel, model_arch

            try:
                return model_arch(v).name
            except UnknownModel as e:
                raise ValueError(e.args[0]) from None
        return v
