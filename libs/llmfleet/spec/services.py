"""The service record and the models of a cluster file (live and simulated read the same keys).

:class:`ServiceSpec` is the one service record: a ``services:`` entry of the cluster file (its key is
the ``name``), an entry of ``llmfleet apply``'s file, and what etcd holds under ``services/{name}``
(read back by the scheduler and the placement leader). It names the service's model, its
:class:`~llmfleet.types.Slo`, its priority and ``max_tokens`` (the output cap of a request that sets
none, default :data:`llmfleet.spec.defaults.DEFAULT_MAX_TOKENS`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    WrapSerializer,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import ArgsKwargs

from llmfleet import renamed
from llmfleet.costmodel import UnknownModel, model_arch
from llmfleet.spec.defaults import DEFAULT_MAX_TOKENS
from llmfleet.spec.sections import DispatchSpec
from llmfleet.types import DEFAULT_SLO, Slo

_STRICT = ConfigDict(extra="forbid")  # a misspelt key is an error naming it, not silently ignored


@dataclass(frozen=True, config=_STRICT)
class ServiceSpec:
    """A service: a model plus its SLO, priority and request bounds (etcd key ``services/{name}``)."""

    name: str
    model: str
    # unset ttft_s/tpot_s take DEFAULT_SLO's: a live service needs both (the scheduler reports them and
    # Aladdin dispatch reads them)
    slo: Slo = DEFAULT_SLO
    priority: int = 0
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, gt=0)  # the output cap of a request that sets none
    # the service's own dispatch policy and its options (None: the scheduler's, scheduler.dispatch);
    # compared, never hashed
    dispatch: DispatchSpec | None = None
    # predict output lengths before dispatch (for engines whose static batcher orders by length);
    # dispatch policies that read predictions get them regardless
    predict: bool = False
    # admission bounds (0: the scheduler's --max-waiting / --max-queued-tokens): past them a request
    # is refused at once (RESOURCE_EXHAUSTED / HTTP 429 with a retry-after), never queued without bound
    max_waiting: int = Field(default=0, ge=0)  # requests admitted that have no first token yet
    max_queued_tokens: int = Field(default=0, ge=0)  # their estimated prompt tokens + max_tokens
    # scale from zero: how long a request for this service's model waits for an engine to load it
    # (0: min(10 x slo.ttft_s, 120 s)); past it UNAVAILABLE with a retry-after
    cold_start_timeout_s: float = Field(default=0.0, ge=0.0)
    # no engine needs to host it: the scheduler is ready (and `llmfleet up` done) without it
    scale_to_zero: bool = False

    @model_validator(mode="before")
    @classmethod
    def _spelling(cls, data: Any) -> Any:
        renamed.refuse_renamed(data.kwargs if isinstance(data, ArgsKwargs) else data, renamed.SERVICE)
        return data

    @field_validator("slo", mode="before")
    @classmethod
    def _slo(cls, v: Any) -> Any:
        if isinstance(v, Slo):
            return v
        if not isinstance(v, Mapping):
            raise ValueError(f"must be a mapping of the SLO keys, got {v!r}")
        return Slo.from_dict({"ttft_s": DEFAULT_SLO.ttft_s, "tpot_s": DEFAULT_SLO.tpot_s, **v}, where="")

    @field_validator("dispatch", mode="before")
    @classmethod
    def _dispatch(cls, v: Any) -> Any:
        if isinstance(v, Mapping) and "policy" not in v:
            raise ValueError(
                "a service's dispatch section names its policy (policy: ...); the scheduler's default "
                "policy takes scheduler.dispatch.options"
            )
        return v

    @model_validator(mode="after")
    def _live_slo(self) -> ServiceSpec:
        if self.slo.ttft_s is None or self.slo.tpot_s is None:
            raise ValueError(f"service {self.name!r}: a live service needs slo.ttft_s and slo.tpot_s")
        return self

    @property
    def deadline_s(self) -> float:
        """``slo.deadline_s`` in its wire form (``GenerateRequest.deadline_s``): 0 when there is none."""
        return self.slo.deadline_s or 0.0

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON data (``dispatch`` a ``{policy, options}`` mapping or None)."""
        return _RECORD.dump_python(self, mode="json")

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> ServiceSpec:
        """The record :meth:`to_json` wrote (a key it does not know is an error naming it)."""
        return _RECORD.validate_json(raw)


_RECORD: TypeAdapter[ServiceSpec] = TypeAdapter(ServiceSpec)


def _named(entries: Any) -> Any:
    """``services:`` entries keyed by name, each given its key as its ``name``."""
    if not isinstance(entries, Mapping):
        return entries
    out = {}
    for name, entry in entries.items():
        if isinstance(entry, Mapping):
            if "name" in entry:
                raise ValueError(f"{name}: a service's name is its key under services:, not a field")
            entry = {**entry, "name": name}
        out[name] = entry
    return out


# the cluster file's (and llmfleet apply's) services: mapping, name -> entry
def _unnamed(entries: dict[str, ServiceSpec], dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
    """The services as the file writes them: each entry without its name (the key)."""
    return {name: {k: v for k, v in entry.items() if k != "name"} for name, entry in dump(entries).items()}


# the cluster file's services: validated with their keys as names, dumped as the file writes them
ServiceMap = Annotated[dict[str, ServiceSpec], BeforeValidator(_named), WrapSerializer(_unnamed)]


class ModelConfig(BaseModel):
    """A ``models:`` entry: a checkpoint (``source``), or a LoRA adapter of another entry (``base`` and
    ``adapter``, a directory in PEFT's saved format: adapter_config.json + adapter_model.safetensors)."""

    model_config = _STRICT

    source: str | None = None
    base: str | None = None
    adapter: str | None = None
    dtype: str = "float32"
    # the cost-model catalog name `llmfleet sim --cluster-config` simulates this model as
    # (default: the model's own name, when it is a catalog name)
    sim_model: str | None = None

    @model_validator(mode="after")
    def _source_or_adapter(self) -> ModelConfig:
        if self.source is not None and (self.base is not None or self.adapter is not None):
            raise ValueError("a model is a checkpoint (source) or an adapter (base and adapter), not both")
        if self.source is None and (self.base is None or self.adapter is None):
            raise ValueError("give source (a checkpoint), or base and adapter (a LoRA adapter of base)")
        return self

    @property
    def is_adapter(self) -> bool:
        return self.adapter is not None

    @field_validator("sim_model")
    @classmethod
    def _sim_model(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                return model_arch(v).name
            except UnknownModel as e:
                raise ValueError(e.args[0]) from None
        return v
