"""Configuration: the cluster file (:class:`ClusterConfig`), etcd settings and env overrides.

The cluster file's sections are the one spec the live services and the simulator share
(:mod:`llmfleet.spec`: services, models, engines, and the engine/dispatch/placement/migration/capacity
policy sections); this module assembles them into :class:`ClusterConfig`.

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
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from llmfleet.costmodel import UnknownModel, hardware, model_arch
from llmfleet.costmodel.memory import kv_pool_bytes
from llmfleet.engine_core.limits import EngineLimits
from llmfleet.spec.engines import EmulatedPool, EngineConfig
from llmfleet.spec.live_loops import (
    MigrationConfig,
    PlacementConfig,
    SchedulerConfig,
)
from llmfleet.spec.sections import FleetPolicies
from llmfleet.spec.services import ModelConfig, ServiceMap, ServiceSpec
from llmfleet.spec.validation import validation_message
from llmfleet.types import DesiredPlacement, ModelSpec

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
    # TLS (https endpoints): the CA verifying etcd, and a client certificate when etcd requires one
    ca_cert: str | None = None
    cert: str | None = None
    key: str | None = None
    # etcd authentication (etcdctl user add / auth enable)
    username: str | None = None
    password: str | None = Field(None, repr=False)

    @property
    def tls(self) -> bool:
        return bool(self.ca_cert or self.cert)

    @model_validator(mode="after")
    def _pairs(self) -> EtcdSettings:
        if bool(self.cert) != bool(self.key):
            raise ValueError("etcd-cert and etcd-key: give both")
        if bool(self.username) != (self.password is not None):
            raise ValueError(
                "etcd-user: needs a password (LLMFLEET_ETCD_PASSWORD or LLMFLEET_ETCD_PASSWORD_FILE)"
            )
        return self

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        v = "/" + v.strip("/")
        return v

    @classmethod
    def from_env(
        cls,
        endpoints: str | None = None,
        prefix: str | None = None,
        ttl: int | None = None,
        ca_cert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        username: str | None = None,
    ):
        env = os.environ
        eps = endpoints or env.get("LLMFLEET_ETCD", DEFAULT_ETCD)
        username = username or env.get("LLMFLEET_ETCD_USER") or None
        password = env.get("LLMFLEET_ETCD_PASSWORD")
        if password is None and (pw_file := env.get("LLMFLEET_ETCD_PASSWORD_FILE")):
            password = Path(pw_file).read_text().strip()
        return cls(
            endpoints=[e.strip() for e in eps.split(",") if e.strip()],
            prefix=prefix or env.get("LLMFLEET_PREFIX", DEFAULT_PREFIX),
            lease_ttl_s=ttl or int(env.get("LLMFLEET_LEASE_TTL", DEFAULT_TTL_S)),
            ca_cert=ca_cert or env.get("LLMFLEET_ETCD_CA") or None,
            cert=cert or env.get("LLMFLEET_ETCD_CERT") or None,
            key=key or env.get("LLMFLEET_ETCD_KEY") or None,
            username=username,
            password=password if username else None,
        )


_STRICT = ConfigDict(extra="forbid")  # a misspelt key is an error naming it, not silently ignored


class ClusterConfig(BaseModel):
    """deploy/local/cluster.yaml: services -> models -> engines."""

    model_config = _STRICT

    services: ServiceMap
    models: dict[str, ModelConfig]
    engines: dict[str, EngineConfig] = Field(default_factory=dict)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    migration: MigrationConfig = Field(default_factory=MigrationConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    emulated: EmulatedPool | None = None  # emulated GPUs instead of the engines: entries

    @model_validator(mode="after")
    def _references(self) -> ClusterConfig:
        for name, svc in self.services.items():
            if svc.model not in self.models:
                raise ValueError(
                    f"service {name!r} uses unknown model {svc.model!r}; known: {sorted(self.models)}"
                )
        for name, m in sorted(self.models.items()):
            if m.base is None:
                continue
            base = self.models.get(m.base)
            if base is None or base.is_adapter:
                raise ValueError(
                    f"model {name!r}: base {m.base!r} must be a checkpoint entry of models:; checkpoints: "
                    f"{sorted(k for k, v in self.models.items() if not v.is_adapter)}"
                )
        for eid, eng in self.engines.items():
            for m in eng.models:
                if m not in self.models:
                    raise ValueError(
                        f"engine {eid!r} lists unknown model {m!r}; known: {sorted(self.models)}"
                    )
                if self.models[m].is_adapter:
                    raise ValueError(
                        f"engine {eid!r} lists adapter {m!r}: engines host base models "
                        f"(list {self.models[m].base!r}); its adapters follow their traffic"
                    )
        adapters = sorted({s.model for s in self.services.values() if self.models[s.model].is_adapter})
        if adapters and self.emulated is not None and not self.emulated.engine.max_loras:
            raise ValueError(
                f"services use LoRA adapters {adapters}: the emulated engines need adapter slots "
                "(emulated.engine.max_loras)"
            )
        if self.placement.planned or self.emulated is not None:
            self.catalog_models()  # a planner / an emulated GPU needs every model in the catalog
        if self.emulated is not None:
            self._check_emulated_fit(self.emulated)
        return self

    def check_live(self) -> None:
        """ValueError naming a setting the file may hold for ``llmfleet sim`` that the live cluster
        cannot run (refused by ``llmfleet up`` and the placement service, never ignored)."""
        if self.placement.adaptive_interval:
            raise ValueError(
                "placement.adaptive_interval: the live placement leader plans every interval_s; SeaLLM's "
                "adaptive interval (Eq. 8) runs in the simulator only (llmfleet sim --cluster-config)"
            )
        for eid, engine in sorted(self.engines.items()):
            if engine.block_tokens is not None:
                raise ValueError(
                    f"engines.{eid}.block_tokens: sizes the blocks of the simulator and of emulated engines "
                    "(emulated.engine); a native engine's block is block_bytes"
                )

    def _check_emulated_fit(self, pool: EmulatedPool) -> None:
        """Every served model must fit one emulated engine alone (else it could never be placed)."""

        hw = hardware(pool.hardware)
        limits = pool.engine.limits()
        for name, cat in self.catalog_models().items():
            kv = kv_pool_bytes(
                hw,
                pool.tp,
                [model_arch(cat)],
                pool.mem_fraction,
                limits.get("max_prefill_tokens", 8192),
                limits.get("max_batch_requests", 256),
            )
            if kv <= 0:
                raise ValueError(
                    f"model {name!r} ({cat}) does not fit one emulated {pool.tp}x{hw.name} engine: its "
                    f"weights and activations exceed {pool.mem_fraction:g} of {pool.tp * hw.mem_bytes / 2**30:.0f} "
                    "GiB; raise emulated.tp"
                )

    def host_model(self, name: str) -> str:
        """The checkpoint entry whose engines serve model ``name``: its base for an adapter, else itself."""
        m = self.models.get(name)
        return m.base if m is not None and m.base is not None else name

    def adapter_bases(self) -> dict[str, str]:
        """Adapter entry -> its base, for the adapters the services use."""
        return {
            s.model: self.host_model(s.model)
            for s in self.services.values()
            if s.model != self.host_model(s.model)
        }

    def planned_engines(self) -> dict[str, Any]:
        """The engines' settings a planner prices, as :class:`~llmfleet.policies.placement.base.GpuPool`
        keywords: the LoRA adapter pool (slots per base, largest rank), the limits (block size,
        watermark, batch sizes) and the memory fraction. An ``emulated:`` pool's engine settings;
        else the largest ``max_loras`` and ``max_lora_rank`` any engine sets (the planner plans one
        pool, so it reserves the largest; 0 slots: LoRA off) with the engine defaults, since a native
        engine sizes its own KV pool (its ``--memory-budget`` less weights and activations), not a share of
        a catalog GPU."""
        if self.emulated is not None:
            e = self.emulated.engine
            return {
                "adapter_slots": e.max_loras or 0,
                "max_lora_rank": e.max_lora_rank or 16,
                "limits": EngineLimits(**e.limits()),
                "mem_fraction": self.emulated.mem_fraction,
            }
        engines = list(self.engines.values())
        slots = max((e.max_loras or 0 for e in engines), default=0)
        rank = max((e.max_lora_rank or 16 for e in engines if e.max_loras), default=16)
        return {"adapter_slots": slots, "max_lora_rank": rank}

    def catalog_models(self) -> dict[str, str]:
        """Served checkpoint -> its cost-model catalog name (``sim_model``, else the model's own name when
        it is a catalog name), for the checkpoints the services run on (an adapter service's is its
        base: engines load bases, adapters follow their traffic). One-to-one: planners work with catalog
        names and the placement leader maps their plans back (two models with one catalog name would
        be indistinguishable); ValueError naming the model otherwise."""

        out: dict[str, str] = {}
        for name in sorted({self.host_model(s.model) for s in self.services.values()}):
            m = self.models[name]
            if m.sim_model is not None:
                out[name] = m.sim_model
                continue
            try:
                out[name] = model_arch(name).name
            except UnknownModel as e:
                raise ValueError(
                    f"model {name!r} is not a cost-model catalog name; set models.{name}.sim_model "
                    f"for the placement planner ({e.args[0]})"
                ) from None
        seen: dict[str, str] = {}
        for name, cat in out.items():
            if cat in seen:
                raise ValueError(
                    f"models {seen[cat]!r} and {name!r} both map to catalog model {cat!r}; "
                    "give one a different sim_model"
                )
            seen[cat] = name
        return out

    @classmethod
    def load(cls, path: str | Path) -> ClusterConfig:
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text())
        except FileNotFoundError as e:
            raise ValueError(f"cluster config not found: {p}") from e
        if not isinstance(data, dict):
            raise ValueError(f"cluster config {p} must be a mapping with services/models/engines")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise ValueError(f"cluster config {p}: {validation_message(e)}") from None

    def service_specs(self) -> list[ServiceSpec]:
        """The service records, by name."""
        return [s for _, s in sorted(self.services.items())]

    def policies(self) -> FleetPolicies:
        """The policy sections this cluster runs, as ``llmfleet sim --cluster-config`` reads them: the
        engines' local policy (one for all: ValueError naming two engines that differ), the schedulers'
        dispatch (a service naming its own must agree), placement, migration and capacity."""
        engines = sorted(self.engines.items())
        if self.emulated is not None:
            engines.append(("emulated", self.emulated.engine))
        engine = engines[0][1].policy_spec() if engines else None
        for eid, e in engines[1:]:
            if e.policy_spec() != engine:
                raise ValueError(
                    f"the simulator runs one engine policy, but engines differ ({engines[0][0]}: "
                    f"{engine.policy} {engine.options}, {eid}: {e.policy} {e.options})"
                )
        dispatch = self.scheduler.dispatch
        for name, svc in sorted(self.services.items()):
            if svc.dispatch is not None and svc.dispatch != dispatch:
                raise ValueError(
                    f"the simulator runs one dispatch policy: service {name!r} dispatches by "
                    f"{svc.dispatch.policy!r} {svc.dispatch.options}, the schedulers by {dispatch.policy!r} "
                    f"{dispatch.options}"
                )
        capacity = self.scheduler.capacity()
        sections = {"placement": self.placement.model_dump(exclude={"hardware", "gpus_per_node"}),
                    "migration": self.migration.model_dump(exclude={"max_concurrency", "load_interval_s"})}  # fmt: skip
        return FleetPolicies(
            engine=engine or FleetPolicies().engine, dispatch=dispatch, capacity=capacity, **sections
        )

    def model_spec(self, name: str) -> ModelSpec:
        """The checkpoint ``name`` loads (ValueError for an adapter entry: it loads onto its base)."""
        m = self.models[name]
        if m.source is None:
            raise ValueError(f"model {name!r} is an adapter of {m.base!r}, not a checkpoint")
        return ModelSpec(name=name, source=m.source, dtype=m.dtype)

    def placements(self) -> list[DesiredPlacement]:
        return [
            DesiredPlacement(engine_id=eid, models=tuple(self.model_spec(m) for m in e.models))
            for eid, e in sorted(self.engines.items())
        ]


__all__ = ["DEFAULT_CONFIG", "DEFAULT_TTL_S", "ClusterConfig", "EtcdSettings"]
