"""What a simulation runs on: the cluster (``32xA100-80GB``), the services and the engine settings."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from llmfleet.costmodel import Hardware, ModelArch, hardware, model_arch
from llmfleet.engine_core import EngineLimits

_CLUSTER = re.compile(r"^\s*(\d+)\s*[xX×]\s*(.+?)\s*$")


@dataclass(frozen=True)
class ClusterSpec:
    """``count`` GPUs of one catalog hardware type."""

    count: int
    hw: Hardware

    @classmethod
    def parse(cls, text: str) -> ClusterSpec:
        """``"32xA100-80GB"`` → 32 × a100-80gb (UnknownHardware lists the valid names)."""
        m = _CLUSTER.match(text)
        if not m:
            raise ValueError(f"cluster must look like '32xA100-80GB', got {text!r}")
        count = int(m.group(1))
        if count < 1:
            raise ValueError(f"cluster needs at least one GPU, got {text!r}")
        return cls(count, hardware(m.group(2)))

    def __str__(self) -> str:
        return f"{self.count}x{self.hw.name}"


@dataclass(frozen=True)
class SimService:
    """A service: its model, SLOs under each paper's definition, and its output cap."""

    name: str
    model: str
    ttft_s: float | None = None  # Aladdin T_pre
    atgt_s: float | None = None  # Aladdin T_dec (average token generation time)
    latency_scale: float = 5.0  # SeaLLM: SLO = scale × the request's execution time
    deadline_s: float | None = None  # UELLM: end-to-end deadline after arrival
    max_tokens: int = 4096  # the per-request output cap (requests stop at EOS = the trace length)
    weight: float = 1.0  # rate share when a workload is split into services

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a service needs a name")
        for k in ("ttft_s", "atgt_s", "deadline_s"):
            v = getattr(self, k)
            if v is not None and v <= 0:
                raise ValueError(f"service {self.name!r}: {k} must be > 0, got {v}")
        if self.latency_scale <= 0 or self.max_tokens < 1 or self.weight <= 0:
            raise ValueError(f"service {self.name!r}: latency_scale, max_tokens, weight must be positive")


@dataclass(frozen=True)
class EngineSettings(EngineLimits):
    """Per-instance engine knobs: the shared :class:`EngineLimits` (vLLM-like GPU defaults) plus what
    only a simulated instance needs (memory fraction, a KV size override, static-batch release)."""

    mem_fraction: float = 0.9  # gpu_memory_utilization
    kv_bytes: int | None = None  # override the KV pool size (e.g. to match a live engine)
    static_release: str = "batch_end"  # static batching: "batch_end" (HF generate) or "eos"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.mem_fraction <= 1:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        if self.static_release not in ("batch_end", "eos"):
            raise ValueError(f"static_release must be 'batch_end' or 'eos', got {self.static_release!r}")


@dataclass(frozen=True)
class SimSpec:
    cluster: ClusterSpec
    services: tuple[SimService, ...]
    engine: EngineSettings = field(default_factory=EngineSettings)

    def __post_init__(self) -> None:
        if not self.services:
            raise ValueError("a simulation needs at least one service")
        names = [s.name for s in self.services]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate service names: {names}")
        for s in self.services:
            model_arch(s.model)  # UnknownModel lists the valid names

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.model for s in self.services))

    def archs(self) -> dict[str, ModelArch]:
        return {m: model_arch(m) for m in self.models}

    def service(self, name: str) -> SimService:
        for s in self.services:
            if s.name == name:
                return s
        raise KeyError(f"unknown service {name!r}; known: {[s.name for s in self.services]}")


def services_from_dicts(items: Sequence[dict]) -> tuple[SimService, ...]:
    out = []
    for i, d in enumerate(items):
        if not isinstance(d, dict):
            raise ValueError(f"service #{i} must be a mapping, got {d!r}")
        unknown = set(d) - set(SimService.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"service #{i}: unknown keys {sorted(unknown)}; valid: {sorted(SimService.__dataclass_fields__)}"
            )
        out.append(SimService(**d))
    return tuple(out)


def load_services(path: str | Path) -> tuple[tuple[SimService, ...], EngineSettings]:
    """Read a services YAML: ``services: [{name, model, ...}]`` and optional ``engine: {...}``."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"services file not found: {p}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: invalid YAML: {e}") from None
    if not isinstance(doc, dict) or "services" not in doc:
        raise ValueError(f"{p}: expected a mapping with a 'services' list")
    services = services_from_dicts(doc["services"])
    eng = doc.get("engine") or {}
    if not isinstance(eng, dict):
        raise ValueError(f"{p}: 'engine' must be a mapping")
    return services, EngineSettings.from_dict(eng, where=f"{p}: engine")
