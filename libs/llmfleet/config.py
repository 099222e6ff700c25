"""Configuration: every knob with its default, pydantic models, YAML files and env overrides.

Environment overrides (all optional):
  LLMFLEET_ETCD           comma-separated etcd endpoints (host:port), default 127.0.0.1:2379
  LLMFLEET_PREFIX         etcd key prefix, default /llmfleet
  LLMFLEET_LEASE_TTL      node lease TTL in seconds, default 10
  LLMFLEET_CONFIG         cluster config path, default deploy/local/cluster.yaml
  OTEL_EXPORTER_OTLP_ENDPOINT   enables OTLP trace export (see llmfleet.telemetry)
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import BaseModel, Field, field_validator, model_validator

from llmfleet.types import DesiredPlacement, ModelSpec, ServiceSpec, Slo

DEFAULT_ETCD = "127.0.0.1:2379"
DEFAULT_PREFIX = "/llmfleet"
DEFAULT_TTL_S = 10
DEFAULT_CONFIG = "deploy/local/cluster.yaml"


class EtcdSettings(BaseModel):
    """How a process reaches etcd."""

    endpoints: list[str] = Field(default_factory=lambda: [DEFAULT_ETCD])
    prefix: str = DEFAULT_PREFIX
    lease_ttl_s: int = Field(DEFAULT_TTL_S, ge=2)
    timeout_s: float = 5.0

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        v = "/" + v.strip("/")
        return v

    @classmethod
    def from_env(cls, endpoints: str | None = None, prefix: str | None = None, ttl: int | None = None):
        eps = endpoints or os.environ.get("LLMFLEET_ETCD", DEFAULT_ETCD)
        return cls(
            endpoints=[e.strip() for e in eps.split(",") if e.strip()],
            prefix=prefix or os.environ.get("LLMFLEET_PREFIX", DEFAULT_PREFIX),
            lease_ttl_s=ttl or int(os.environ.get("LLMFLEET_LEASE_TTL", DEFAULT_TTL_S)),
        )


class SloConfig(BaseModel):
    ttft_s: float = Field(5.0, gt=0)
    tpot_s: float = Field(0.5, gt=0)


class ServiceConfig(BaseModel):
    model: str
    slo: SloConfig = Field(default_factory=SloConfig)
    priority: int = 0
    default_max_tokens: int = Field(64, gt=0)
    dispatch: str = ""  # dispatch policy name for this service; "" = the scheduler's --dispatch
    deadline_s: float = Field(0.0, ge=0)  # end-to-end deadline after arrival (0 = none)
    # predict output lengths before dispatch (for engines whose static batcher orders by length);
    # dispatch policies that read predictions get them regardless
    predict: bool = False

    @field_validator("dispatch")
    @classmethod
    def _dispatch(cls, v: str) -> str:
        from llmfleet.policies.dispatch import POLICIES

        if v and v not in POLICIES:
            raise ValueError(f"unknown dispatch policy {v!r}; valid: {sorted(POLICIES)}")
        return v


class ModelConfig(BaseModel):
    source: str
    dtype: str = "float32"


class EngineConfig(BaseModel):
    models: list[str] = Field(default_factory=list)
    device: str = "cpu"
    port: int | None = None
    policy: str = "fcfs"  # engine-local policy: a request policy or a static batcher (static mode)

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        from llmfleet.policies.engine_policy import ENGINE_POLICIES

        if v not in ENGINE_POLICIES:
            raise ValueError(f"unknown engine policy {v!r}; valid: {list(ENGINE_POLICIES)}")
        return v


class ClusterConfig(BaseModel):
    """deploy/local/cluster.yaml: services -> models -> engines."""

    services: dict[str, ServiceConfig]
    models: dict[str, ModelConfig]
    engines: dict[str, EngineConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _references(self) -> ClusterConfig:
        for name, svc in self.services.items():
            if svc.model not in self.models:
                raise ValueError(
                    f"service {name!r} uses unknown model {svc.model!r}; known: {sorted(self.models)}"
                )
        for eid, eng in self.engines.items():
            for m in eng.models:
                if m not in self.models:
                    raise ValueError(
                        f"engine {eid!r} lists unknown model {m!r}; known: {sorted(self.models)}"
                    )
        return self

    @classmethod
    def load(cls, path: str | Path) -> ClusterConfig:
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text())
        except FileNotFoundError as e:
            raise ValueError(f"cluster config not found: {p}") from e
        if not isinstance(data, dict):
            raise ValueError(f"cluster config {p} must be a mapping with services/models/engines")
        return cls.model_validate(data)

    def service_specs(self) -> list[ServiceSpec]:
        return [
            ServiceSpec(
                name=n,
                model=s.model,
                slo=Slo(ttft_s=s.slo.ttft_s, tpot_s=s.slo.tpot_s),
                priority=s.priority,
                default_max_tokens=s.default_max_tokens,
                dispatch=s.dispatch,
                deadline_s=s.deadline_s,
                predict=s.predict,
            )
            for n, s in sorted(self.services.items())
        ]

    def model_spec(self, name: str) -> ModelSpec:
        m = self.models[name]
        return ModelSpec(name=name, source=m.source, dtype=m.dtype)

    def placements(self) -> list[DesiredPlacement]:
        return [
            DesiredPlacement(engine_id=eid, models=tuple(self.model_spec(m) for m in e.models))
            for eid, e in sorted(self.engines.items())
        ]
