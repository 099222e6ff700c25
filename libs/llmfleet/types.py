"""Core dataclasses shared by policies, services and the simulator (plain data, no I/O)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from llmfleet.renamed import SLO as SLO_READER
from llmfleet.renamed import refuse_renamed

ENGINE_ROLE = "engine"
CONTROL_ROLES = ("scheduler", "profiler", "placement", "migration")


@dataclass(frozen=True)
class ModelSpec:
    """A model an engine can load: `source` is a checkpoint dir, a hub id or ``tiny://<arch>``."""

    name: str
    source: str
    dtype: str = "float32"
    # (module, device) pairs in transformers' ``device_map`` form (e.g. a HELR plan); () = one device
    device_map: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        raw = self.device_map.items() if isinstance(self.device_map, Mapping) else self.device_map
        pairs = tuple((str(module), str(device)) for module, device in raw)
        object.__setattr__(self, "device_map", pairs)


@dataclass(frozen=True)
class Slo:
    """A service's latency objectives, one type for live and simulated services (seconds).

    * ``ttft_s`` — time to first token (Aladdin's T_pre).
    * ``tpot_s`` — time per output token after the first, i.e. Aladdin's ATGT (average token
      generation time, T_dec).
    * ``latency_scale`` — SeaLLM: a request meets its SLO when its latency is at most this many times
      its execution time alone on the engine.
    * ``deadline_s`` — UELLM: end-to-end deadline after arrival (engines' SLO-ODBS/S3 batchers read it).

    ``None`` means "not an objective of this service" (the simulator then leaves that paper's
    attainment out). A live :class:`~llmfleet.spec.services.ServiceSpec` needs ``ttft_s`` and ``tpot_s`` (the scheduler reports
    them and Aladdin dispatch reads them); its default is :data:`DEFAULT_SLO`.
    """

    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_scale: float = 5.0
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        for name in SLO_KEYS:
            v = getattr(self, name)
            if v is None and name != "latency_scale":
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")
            object.__setattr__(self, name, float(v))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "slo") -> Slo:
        """From a mapping of :data:`SLO_KEYS`; an unknown key is an error naming the valid ones, an old
        spelling (Aladdin's ``atgt_s``) one naming the current."""
        if not isinstance(d, Mapping):
            raise ValueError(_at(where, f"must be a mapping of {list(SLO_KEYS)}, got {d!r}"))
        try:
            refuse_renamed(d, SLO_READER)
            unknown = set(d) - set(SLO_KEYS)
            if unknown:
                raise ValueError(f"unknown keys {sorted(unknown)}; valid: {list(SLO_KEYS)}")
            return cls(**d)
        except ValueError as e:
            raise ValueError(_at(where, str(e))) from None


def _at(where: str, message: str) -> str:
    return f"{where}: {message}" if where else message


SLO_KEYS: tuple[str, ...] = ("ttft_s", "tpot_s", "latency_scale", "deadline_s")
DEFAULT_SLO = Slo(ttft_s=5.0, tpot_s=0.5)  # a live service's SLO where its config sets none


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
    hardware: str = ""  # engines: catalog name (llmfleet.costmodel.hardware) or the raw device name
    tp: int = 1  # engines: GPUs the engine spans (memory_bytes covers all of them)

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
        models = [asdict(m) for m in self.models]
        for m in models:  # records without a map stay as before
            if not m["device_map"]:
                del m["device_map"]
        return json.dumps({"engine_id": self.engine_id, "models": models}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> DesiredPlacement:
        d = json.loads(raw)
        return cls(engine_id=d["engine_id"], models=tuple(ModelSpec(**m) for m in d.get("models", ())))
