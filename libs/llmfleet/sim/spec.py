"""What a simulation runs on: the cluster (``32xA100-80GB``), the services and the engine settings."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from llmfleet.costmodel import MODEL_CATALOG, Hardware, ModelArch, UnknownModel, hardware, model_arch
from llmfleet.costmodel.lora import declared_rank
from llmfleet.costmodel.sources import DEFAULT_COST_SOURCE, check_cost_source
from llmfleet.engine_core import EngineLimits
from llmfleet.policies.placement.dedicated_even import smallest_tp
from llmfleet.renamed import SIM_SERVICE, refuse_renamed
from llmfleet.types import SLO_KEYS, Slo

if TYPE_CHECKING:
    from llmfleet.config import ClusterConfig

_CLUSTER = re.compile(r"^\s*(\d+)\s*[xX×]\s*(.+?)\s*$")


@dataclass(frozen=True)
class ClusterSpec:
    """``count`` GPUs of one catalog hardware type. ``engine_gpus``: the planners' instances are at most
    this many GPUs (a live fleet of fixed-size engines: ``llmfleet up --emulate`` starts one engine per
    GPU, and the live leader plans instances the size of its engines); None: up to a node."""

    count: int
    hw: Hardware
    engine_gpus: int | None = None

    def __post_init__(self) -> None:
        if self.engine_gpus is not None and self.engine_gpus < 1:
            raise ValueError(f"engine_gpus must be >= 1, got {self.engine_gpus}")

    @property
    def max_tp(self) -> int:
        """The largest instance a planner may make here."""
        return min(self.hw.gpus_per_node, self.engine_gpus or self.hw.gpus_per_node)

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
    """A service: its model (a cost-model catalog name), its :class:`~llmfleet.types.Slo` — the same
    type a live service has, each paper's attainment computed from the objectives it sets — and its
    output cap."""

    name: str
    model: str
    slo: Slo = field(default_factory=Slo)  # no TTFT/TPOT objective or deadline; SeaLLM scale 5×
    max_tokens: int = 4096  # the per-request output cap (requests stop at EOS = the trace length)
    weight: float = 1.0  # rate share when a workload is split into services
    priority: int = 0  # waiting for capacity: higher first (the live ServiceSpec's priority)
    cold_start_timeout_s: float = 0.0  # scale from zero: the wait bound (0: min(10 x TTFT SLO, 120 s))
    # a LoRA adapter of ``model`` the service's requests name ("": the model itself), and its rank
    adapter: str = ""
    lora_rank: int = 16

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a service needs a name")
        if self.lora_rank < 1:
            raise ValueError(f"service {self.name!r}: lora_rank must be >= 1, got {self.lora_rank}")
        if not isinstance(self.slo, Slo):
            raise ValueError(f"service {self.name!r}: slo must be an llmfleet.types.Slo, got {self.slo!r}")
        if self.max_tokens < 1 or self.weight <= 0:
            raise ValueError(f"service {self.name!r}: max_tokens and weight must be positive")

    @property
    def deadline_s(self) -> float | None:
        """``slo.deadline_s`` (UELLM), read when a request arrives."""
        return self.slo.deadline_s

    @property
    def routed_model(self) -> str:
        """The model its requests name to the dispatcher: the adapter, else the model."""
        return self.adapter or self.model


@dataclass(frozen=True)
class EngineSettings(EngineLimits):
    """Per-instance engine knobs: the shared :class:`EngineLimits` (vLLM-like GPU defaults) plus what
    only a simulated instance needs (memory fraction, a KV size override, static-batch release, decode
    only)."""

    mem_fraction: float = 0.9  # gpu_memory_utilization
    kv_bytes: int | None = None  # override the KV pool size (e.g. to match a live engine)
    static_release: str = "batch_end"  # static batching: "batch_end" (HF generate) or "eos"
    max_loras: int = 0  # LoRA adapter slots per base model (0: LoRA off; the native engine's max_loras)
    max_lora_rank: int = 16  # the largest adapter rank served: sizes the adapter pool's memory
    # split-phase decode instances: a request arrives prefilled elsewhere, its KV with it
    # (llmfleet.sim.decode_only); TTFT is the prefill worker's, its first step here a decode
    decode_only: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.mem_fraction <= 1:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        if self.static_release not in ("batch_end", "eos"):
            raise ValueError(f"static_release must be 'batch_end' or 'eos', got {self.static_release!r}")
        if self.max_loras < 0 or self.max_lora_rank < 1:
            raise ValueError(
                f"max_loras >= 0 and max_lora_rank >= 1 required, got {self.max_loras}, {self.max_lora_rank}"
            )


@dataclass(frozen=True)
class SimSpec:
    cluster: ClusterSpec
    services: tuple[SimService, ...]
    engine: EngineSettings = field(default_factory=EngineSettings)
    cost_source: str = DEFAULT_COST_SOURCE  # iteration costs without a profile (costmodel.sources)

    def __post_init__(self) -> None:
        if not self.services:
            raise ValueError("a simulation needs at least one service")
        check_cost_source(self.cost_source)
        names = [s.name for s in self.services]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate service names: {names}")
        for s in self.services:
            model_arch(s.model)  # UnknownModel lists the valid names
        clash = sorted({s.adapter for s in self.services} & set(self.models))
        if clash:
            raise ValueError(f"adapters {clash} have the name of a served model")
        for s in self.services:
            if s.adapter and s.lora_rank > self.engine.max_lora_rank:
                raise ValueError(
                    f"service {s.name!r}: adapter {s.adapter!r} of rank {s.lora_rank} exceeds the engines' "
                    f"max_lora_rank {self.engine.max_lora_rank}"
                )

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.model for s in self.services))

    @property
    def adapters(self) -> dict[str, tuple[str, ...]]:
        """Base model -> the LoRA adapters its services name (none for a model without adapters)."""
        out: dict[str, dict[str, None]] = {}
        for s in self.services:
            if s.adapter:
                out.setdefault(s.model, {})[s.adapter] = None
        return {m: tuple(a) for m, a in out.items()}

    def archs(self) -> dict[str, ModelArch]:
        return {m: model_arch(m) for m in self.models}

    def reference_tps(self) -> dict[str, int]:
        """Per model, :func:`reference_tp` on the cluster's hardware."""
        return {m: reference_tp(a, self.cluster.hw) for m, a in self.archs().items()}

    def normalized_reference(self) -> list[dict[str, Any]]:
        """What normalized latency divides by, for reports: each model's hardware and reference TP."""
        hw = self.cluster.hw.name
        return [{"model": m, "hardware": hw, "tp": tp} for m, tp in self.reference_tps().items()]

    def service(self, name: str) -> SimService:
        for s in self.services:
            if s.name == name:
                return s
        raise KeyError(f"unknown service {name!r}; known: {[s.name for s in self.services]}")


_SERVICE_KEYS = ("name", "model", "slo", "max_tokens", "weight", "adapter", "lora_rank")


def reference_tp(arch: ModelArch, hw: Hardware) -> int:
    """The TP of the execution time normalized latency divides by (the simulator's and the live
    report's): the smallest power of two whose GPUs hold the weights (1 for a model that fits one GPU,
    as SeaLLM profiles "on one GPU", §4), else a node. Fixed per model and hardware, so every system
    compared on the same requests has the same denominator, whatever its own tensor parallelism."""
    return smallest_tp(arch.weight_bytes, hw.mem_bytes, hw.gpus_per_node, 0.0) or hw.gpus_per_node


def service_from_dict(d: Mapping[str, Any], where: str = "service") -> SimService:
    """``{name, model, slo: {ttft_s, tpot_s, latency_scale, deadline_s}, max_tokens, weight, adapter,
    lora_rank}``."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{where} must be a mapping, got {d!r}")
    try:
        refuse_renamed(d, SIM_SERVICE)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    unknown = set(d) - set(_SERVICE_KEYS)
    if unknown:
        raise ValueError(
            f"{where}: unknown keys {sorted(unknown)}; valid: {[*_SERVICE_KEYS]} (SLO keys in slo: {list(SLO_KEYS)})"
        )
    fields = dict(d)
    fields["slo"] = Slo.from_dict(d.get("slo") or {}, where=f"{where}: slo")
    return SimService(**fields)


def services_from_dicts(items: Sequence[Mapping[str, Any]]) -> tuple[SimService, ...]:
    return tuple(service_from_dict(d, where=f"service #{i}") for i, d in enumerate(items))


def from_cluster_config(config: ClusterConfig) -> tuple[tuple[SimService, ...], EngineSettings]:
    """The services of a live cluster config (``llmfleet sim --cluster-config``), and its engines' limits.

    Each service keeps its :class:`~llmfleet.types.Slo`; its model is the model's ``sim_model`` or, when
    that is unset, the model's own name if it is a catalog name. The simulator runs one engine setting:
    each limit an engine sets applies to every instance (engines that set one differently are an error),
    limits no engine sets keep the simulator's GPU defaults, and ``block_bytes`` (sized for the live
    engine's own models) is left to the simulator's ``block_tokens``. An ``emulated:`` pool's
    ``mem_fraction`` sizes every instance's memory, as it sizes the emulated engines'. A service of a
    LoRA adapter runs on its base's catalog model and names the adapter (``SimService.adapter``);
    the engines' ``max_loras`` / ``max_lora_rank`` are merged like the limits (an adapter's rank is the
    one its entry declares, ``adapter: emulated://rN``, as the emulated engines read it, else
    ``max_lora_rank``: a directory's rank is in its files, and the pool pads every adapter to it).
    """
    services = []
    declared: dict[str, int] = {}  # service -> the rank its adapter entry declares
    for name, svc in sorted(config.services.items()):
        model = config.models[svc.model]
        adapter, model_name = "", svc.model
        if model.is_adapter and model.base is not None:  # an adapter runs on its base
            adapter, model_name = svc.model, model.base
            if (rank := declared_rank(model.adapter)) is not None:
                declared[name] = rank
            model = config.models[model.base]
        sim_model = model.sim_model or model_name
        try:
            sim_model = model_arch(sim_model).name
        except UnknownModel:
            raise ValueError(
                f"service {name!r}: model {model_name!r} (source {model.source}) is not in the cost-model "
                f"catalog; give it a sim_model: one of {sorted(MODEL_CATALOG)}"
            ) from None
        services.append(
            SimService(
                name, sim_model, svc.slo, priority=svc.priority,
                cold_start_timeout_s=svc.cold_start_timeout_s, adapter=adapter,
            )
        )  # fmt: skip
    merged: dict[str, Any] = {}
    set_by: dict[str, str] = {}
    engines = sorted(config.engines.items())
    if config.emulated is not None:  # every emulated GPU runs the pool's engine settings
        engines.append(("emulated", config.emulated.engine))
    for eid, e in engines:
        lora = {k: v for k in ("max_loras", "max_lora_rank") if (v := getattr(e, k)) is not None}
        for key, value in [*e.limits().items(), *lora.items()]:
            if key == "block_bytes":
                continue
            if merged.setdefault(key, value) != value:
                raise ValueError(
                    f"the simulator runs one engine setting, but engines set different {key} "
                    f"({set_by[key]}: {merged[key]}, {eid}: {value})"
                )
            set_by.setdefault(key, eid)
    if config.emulated is not None:  # the emulated GPUs' share of memory for weights and KV
        merged["mem_fraction"] = config.emulated.mem_fraction
    engine = EngineSettings.from_dict(merged, where="engines")
    # an adapter's rank is in its directory, not the file: priced at the pool's, which pads to it (an
    # entry emulated://rN declares N, as the emulated engines read it)
    services = [
        dataclasses.replace(s, lora_rank=declared.get(s.name, engine.max_lora_rank)) if s.adapter else s
        for s in services
    ]
    return tuple(services), engine


def load_services(path: str | Path) -> tuple[tuple[SimService, ...], EngineSettings]:
    """Read a services YAML: ``services: [{name, model, slo: {...}, ...}]`` and optional ``engine: {...}``."""
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
