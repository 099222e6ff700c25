"""Configuration: every knob with its default, pydantic models, YAML files and env overrides.

Environment overrides (all optional):
  LLMFLEET_ETCD           comma-separated etcd endpoints (host:port), default 127.0.0.1:2379
  LLMFLEET_PREFIX         etcd key prefix, default /llmfleet
  LLMFLEET_LEASE_TTL      node lease TTL in seconds, default 10
  LLMFLEET_CONFIG         cluster config path, default deploy/local/cluster.yaml
  OTEL_EXPORTER_OTLP_ENDPOINT   enables OTLP trace export (see llmfleet.telemetry)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from llmfleet.types import DEFAULT_SLO, DesiredPlacement, ModelSpec, ServiceSpec, Slo

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
    default_max_tokens: int = Field(64, gt=0)
    dispatch: str = ""  # dispatch policy name for this service; "" = the scheduler's --dispatch
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
        return data

    @field_validator("dispatch")
    @classmethod
    def _dispatch(cls, v: str) -> str:
        from llmfleet.policies.dispatch import POLICIES, SCHEDULER_MODES

        if v and v not in POLICIES and v not in SCHEDULER_MODES:
            raise ValueError(f"unknown dispatch policy {v!r}; valid: {sorted([*POLICIES, *SCHEDULER_MODES])}")
        return v


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


# EngineLimits field -> the engine's flag (block_tokens is the simulator's block size: no live flag)
ENGINE_LIMIT_FLAGS: dict[str, str | None] = {
    "max_running": "--max-running",
    "max_batch_requests": "--max-batch-requests",
    "max_prefill_tokens": "--max-prefill-tokens",
    "watermark": "--watermark",
    "block_bytes": "--block-bytes",
    "block_tokens": None,
}


class EngineConfig(BaseModel):
    """One engine: its models, the local policy with its constructor options, and the
    :class:`~llmfleet.engine_core.EngineLimits` it sets (unset: the engine's defaults)."""

    model_config = _STRICT

    models: list[str] = Field(default_factory=list)
    device: str = "cpu"
    port: int | None = None
    policy: str = "fcfs"  # engine-local policy: a request policy or a static batcher (static mode)
    # the policy's constructor options, e.g. {batch_size: 8, max_iterations: 64}; static batchers also
    # take keep_kv (default true; false = the papers' static mode: padded rows, recompute at slice ends)
    policy_options: dict[str, Any] = Field(default_factory=dict)
    # EngineLimits (llmfleet.engine_core), same names as the simulator's engine settings
    max_running: int | None = Field(None, ge=1)
    max_batch_requests: int | None = Field(None, ge=1)
    max_prefill_tokens: int | None = Field(None, ge=1)
    watermark: float | None = Field(None, ge=0, lt=1)
    block_tokens: int | None = Field(None, ge=1)
    block_bytes: int | None = Field(None, ge=16, multiple_of=16)
    # deliver tokens to streams at most this often (first and final chunks at once; 0 = every iteration)
    stream_interval_s: float | None = Field(None, ge=0)
    # torch intra-op threads of a CPU engine (unset: `llmfleet up` shares the host's cores among the
    # CPU engines it starts, at least one each, so that engines on one host do not oversubscribe it)
    threads: int | None = Field(None, ge=1)

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        from llmfleet.policies.engine_policy import ENGINE_POLICIES

        if v not in ENGINE_POLICIES:
            raise ValueError(f"unknown engine policy {v!r}; valid: {list(ENGINE_POLICIES)}")
        return v

    @field_validator("policy_options")
    @classmethod
    def _policy_options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        from llmfleet.policies.engine_policy import make_engine_policy

        if "policy" in info.data:  # else the policy itself is the error
            make_engine_policy(info.data["policy"], **v)  # builds it: a bad option is named here
        return v

    @model_validator(mode="after")
    def _limits(self) -> EngineConfig:
        from llmfleet.engine_core import EngineLimits

        EngineLimits(**self.limits())  # the engine's own checks
        return self

    def limits(self) -> dict[str, Any]:
        """The :class:`~llmfleet.engine_core.EngineLimits` fields this entry sets."""
        return {k: getattr(self, k) for k in ENGINE_LIMIT_FLAGS if getattr(self, k) is not None}

    def engine_args(self) -> list[str]:
        """``llmfleet-engine`` flags for the policy, its options and the limits set here."""
        argv = ["--policy", self.policy]
        if self.policy_options:
            argv += ["--policy-options", json.dumps(self.policy_options, sort_keys=True)]
        for key, value in self.limits().items():
            flag = ENGINE_LIMIT_FLAGS[key]
            if flag is not None:
                argv += [flag, str(value)]
        if self.stream_interval_s is not None:
            argv += ["--stream-interval-s", str(self.stream_interval_s)]
        if self.threads is not None:
            argv += ["--threads", str(self.threads)]
        return argv


STATIC_POLICY = "static"  # the placement policy that copies ``engines:`` into etcd (no planner)


def placement_policy_names() -> list[str]:
    """Valid ``placement.policy`` values: ``static`` and every planner of the placement registry."""
    from llmfleet.policies.placement import POLICIES

    return [STATIC_POLICY, *sorted(POLICIES)]


class PlacementConfig(BaseModel):
    """The placement leader's loop. ``static`` writes the ``engines:`` lists as they are (no planner);
    any other policy is a planner of ``llmfleet.policies.placement`` run every ``interval_s`` over the
    monitored workload and the live engine pool (``engines:`` then only says which engines
    ``llmfleet up`` starts and with which settings; their ``models`` are ignored)."""

    model_config = _STRICT

    policy: str = STATIC_POLICY
    interval_s: float = Field(30.0, gt=0, allow_inf_nan=False)
    options: dict[str, Any] = Field(default_factory=dict)  # the planner's constructor options
    hardware: str = "cpu"  # catalog hardware of the pool when engines report none (or disagree)
    gpus_per_node: int = Field(8, ge=1)
    # hysteresis: a changed plan is applied once the planner has proposed it this many intervals in a
    # row (1: at once); a plan that serves an unserved model, or the first plan, is applied at once
    confirm_intervals: int = Field(2, ge=1)
    window_s: float | None = None  # the monitor window the planner reads: 10, 60 or 300 (None: 60)

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in placement_policy_names():
            raise ValueError(f"unknown placement policy {v!r}; valid: {placement_policy_names()}")
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        policy = info.data.get("policy")
        if policy is not None and policy != STATIC_POLICY:
            from llmfleet.policies.placement import make_placement_policy

            make_placement_policy(policy, **v)  # builds it: a bad option is named here
        elif policy == STATIC_POLICY and v:
            raise ValueError("the static placement policy takes no options")
        return v

    @field_validator("window_s")
    @classmethod
    def _window(cls, v: float | None) -> float | None:
        from llmfleet.monitor.window import DEFAULT_WINDOWS_S

        if v is not None and v not in DEFAULT_WINDOWS_S:
            raise ValueError(
                f"window_s must be one of the windows the schedulers report, "
                f"{', '.join(f'{w:g}' for w in DEFAULT_WINDOWS_S)} s; got {v:g}"
            )
        return v

    @field_validator("hardware")
    @classmethod
    def _hardware(cls, v: str) -> str:
        from llmfleet.costmodel.hardware import UnknownHardware, hardware

        try:
            return hardware(v).name
        except UnknownHardware as e:
            raise ValueError(e.args[0]) from None

    @property
    def planned(self) -> bool:
        """Whether a planner decides (any policy but ``static``)."""
        return self.policy != STATIC_POLICY


def validation_message(e: ValidationError) -> str:
    """pydantic's errors as ``where.the.key: what is wrong`` lines (without the input dumps)."""
    lines = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] != "value_error" and not isinstance(err.get("input"), dict | list):
            msg += f", got {err.get('input')!r}"
        lines.append(f"{where}: {msg}" if where else msg)
    return lines[0] if len(lines) == 1 else "\n  " + "\n  ".join(lines)


class MigrationConfig(BaseModel):
    """The migration leader's loop (``llmfleet-migration``; README "Migration coordinator"): its
    policy (``none``, ``mell``, ``llumnix_lb``) and its options (the simulator's ``migration_options``,
    e.g. ``mell: {batching: false}``), epoch, how moves travel and how many run at once."""

    model_config = _STRICT

    policy: str = "none"
    options: dict[str, Any] = Field(default_factory=dict)
    epoch_s: float = Field(1.0, gt=0, allow_inf_nan=False)
    transfer: str = "hybrid"
    max_concurrency: int = Field(4, ge=1)
    load_interval_s: float = Field(1.0, gt=0, allow_inf_nan=False)  # the engines' load snapshot period

    @model_validator(mode="after")
    def _policies(self) -> MigrationConfig:
        from llmfleet.policies.migration import make_migration_policy, make_transfer_planner

        make_migration_policy(self.policy, **self.options)  # a bad name or option is named here
        make_transfer_planner(self.transfer)
        return self

    def args(self) -> list[str]:
        """The ``llmfleet-migration`` flags for this section."""
        return [
            "--policy", self.policy, "--policy-options", json.dumps(self.options),
            "--epoch-s", f"{self.epoch_s:g}", "--transfer", self.transfer,
            "--max-concurrency", str(self.max_concurrency), "--load-interval-s", f"{self.load_interval_s:g}",
        ]  # fmt: skip


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
    cost_source: str = "roofline"
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
        if v not in ("roofline", "vidur"):
            raise ValueError(f"unknown cost source {v!r}; valid: ['roofline', 'vidur']")
        return v

    @model_validator(mode="after")
    def _layout(self) -> EmulatedPool:
        if self.processes > self.count:
            raise ValueError(f"processes ({self.processes}) must not exceed count ({self.count})")
        if self.engine.models or self.engine.device != "cpu" or self.engine.port is not None:
            raise ValueError(
                "emulated.engine takes the local policy and limits only (no models, device or port)"
            )
        return self

    def per_process(self) -> list[int]:
        """Engines in each process (as even as the division allows)."""
        q, r = divmod(self.count, self.processes)
        return [q + (i < r) for i in range(self.processes)]


class SchedulerConfig(BaseModel):
    """How the schedulers wait for capacity (README "Requests wait for capacity"; ``llmfleet up`` passes
    these as ``llmfleet-scheduler`` flags, ``llmfleet sim --cluster-config`` simulates the binding)."""

    model_config = _STRICT

    # late: hold a request while every engine hosting its model is saturated; early: bind on arrival
    binding: Literal["early", "late"] = "late"
    queue_slack: int = Field(4, ge=0)  # late binding: requests an engine may queue beyond its batch
    kv_room_fraction: float = Field(0.95, gt=0, le=1, allow_inf_nan=False)  # ... and its KV share
    # every second, move not-started requests off engines past their room (the alternative to late)
    move_queued: bool = False
    cold_start: bool = True  # hold requests for a model no engine hosts while placement loads it
    ready_when: Literal["servable", "started"] = "servable"  # the scheduler's readiness

    def args(self) -> list[str]:
        """The ``llmfleet-scheduler`` flags for these settings."""
        out = ["--binding", self.binding, "--queue-slack", str(self.queue_slack)]
        out += ["--kv-room-fraction", str(self.kv_room_fraction), "--ready-when", self.ready_when]
        out += ["--move-queued"] if self.move_queued else []
        return out + ([] if self.cold_start else ["--no-cold-start"])


class ClusterConfig(BaseModel):
    """deploy/local/cluster.yaml: services -> models -> engines."""

    model_config = _STRICT

    services: dict[str, ServiceConfig]
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
        for eid, eng in self.engines.items():
            for m in eng.models:
                if m not in self.models:
                    raise ValueError(
                        f"engine {eid!r} lists unknown model {m!r}; known: {sorted(self.models)}"
                    )
        if self.placement.planned or self.emulated is not None:
            self.catalog_models()  # a planner / an emulated GPU needs every model in the catalog
        if self.emulated is not None:
            self._check_emulated_fit(self.emulated)
        return self

    def _check_emulated_fit(self, pool: EmulatedPool) -> None:
        """Every served model must fit one emulated engine alone (else it could never be placed)."""
        from llmfleet.costmodel import hardware, model_arch
        from llmfleet.costmodel.memory import kv_pool_bytes

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

    def catalog_models(self) -> dict[str, str]:
        """Served model -> its cost-model catalog name (``sim_model``, else the model's own name when it
        is a catalog name), for the models the services use. One-to-one: planners work with catalog
        names and the placement leader maps their plans back (two models with one catalog name would
        be indistinguishable); ValueError naming the model otherwise."""
        from llmfleet.costmodel import UnknownModel, model_arch

        out: dict[str, str] = {}
        for name in sorted({s.model for s in self.services.values()}):
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
        return [
            ServiceSpec(
                name=n,
                model=s.model,
                slo=s.slo.to_slo(),
                priority=s.priority,
                default_max_tokens=s.default_max_tokens,
                dispatch=s.dispatch,
                predict=s.predict,
                max_waiting=s.max_waiting,
                max_queued_tokens=s.max_queued_tokens,
                cold_start_timeout_s=s.cold_start_timeout_s,
                scale_to_zero=s.scale_to_zero,
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
