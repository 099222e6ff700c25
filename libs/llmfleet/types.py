"""Core dataclasses shared by policies, services and the simulator (plain data, no I/O)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

ENGINE_ROLE = "engine"
CONTROL_ROLES = ("scheduler", "profiler", "placement", "migration")


@dataclass(frozen=True)
class ModelSpec:
    """A model an engine can load: `source` is a checkpoint dir, a hub id or ``tiny://<arch>``."""

    name: str
    source: str
    dtype: str = "float32"


@dataclass(frozen=True)
class Slo:
    """Per-service latency objectives in seconds (time to first token, time per output token)."""

    ttft_s: float = 5.0
    tpot_s: float = 0.5


@dataclass(frozen=True)
class ServiceSpec:
    """A service: a model plus its SLO and priority (etcd key ``services/{name}``)."""

    name: str
    model: str
    slo: Slo = field(default_factory=Slo)
    priority: int = 0
    default_max_tokens: int = 64
    dispatch: str = ""  # the scheduler's dispatch policy for this service ("" = the scheduler default)
    deadline_s: float = 0.0  # UELLM-style end-to-end deadline after arrival (0 = none)
    predict: bool = False  # ask the profiler for output lengths even if the dispatch policy does not

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> ServiceSpec:
        d = json.loads(raw)
        d["slo"] = Slo(**d.get("slo", {}))
        return cls(**d)


@dataclass(frozen=True)
class NodeRecord:
    """What a process publishes under ``nodes/{node_id}``, bound to its lease."""

    node_id: str
    role: str
    address: str
    device: str = ""
    memory_bytes: int = 0
    kv_capacity_bytes: int = 0
    models: tuple[str, ...] = ()
    pid: int = 0
    started_at: float = 0.0

    def to_json(self) -> bytes:
        d: dict[str, Any] = asdict(self)
        d["models"] = list(self.models)
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> NodeRecord:
        d = json.loads(raw)
        d["models"] = tuple(d.get("models", ()))
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class DesiredPlacement:
    """Desired models for one engine (etcd key ``placement/{engine_id}``), written by the leader."""

    engine_id: str
    models: tuple[ModelSpec, ...] = ()

    def to_json(self) -> bytes:
        return json.dumps(
            {"engine_id": self.engine_id, "models": [asdict(m) for m in self.models]}, sort_keys=True
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> DesiredPlacement:
        d = json.loads(raw)
        return cls(engine_id=d["engine_id"], models=tuple(ModelSpec(**m) for m in d.get("models", ())))
