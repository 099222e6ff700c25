"""What UELLM's HELR deployer (``helr.py``) plans over: devices with their memory and relative
performance, the link latencies between them (:class:`Topology`), and a model as ``Layer(M)`` layers of
``M`` bytes (:class:`LayeredModel`, from the catalog or a HF config). Pure: no I/O, no torch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmfleet.costmodel.models import ModelArch, arch_from_hf_config, model_arch

__all__ = ["Device", "LayeredModel", "Topology", "layered_model"]


@dataclass(frozen=True)
class Device:
    """A device the model can be placed on: ``name`` as torch spells it ("cuda:0", "cpu")."""

    name: str
    memory_bytes: int
    performance: float  # relative compute speed, higher = faster

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ValueError("device name is empty")
        if self.memory_bytes < 0:
            raise ValueError(f"device {self.name!r}: memory_bytes must be >= 0, got {self.memory_bytes}")
        if not math.isfinite(self.performance) or self.performance <= 0:
            raise ValueError(f"device {self.name!r}: performance must be > 0, got {self.performance}")


LinkLatencies = Mapping[tuple[str, str], float] | Sequence[Sequence[float]]


@dataclass(frozen=True)
class Topology:
    """Devices plus the link latency (seconds) between every pair: the paper's undirected G(D, E).

    ``link_latency_s`` is either a mapping ``{(a, b): seconds}`` by device name — one direction per
    pair suffices, both must agree when given — or an ``n×n`` symmetric matrix in device order with a
    zero diagonal. A missing pair is a ValueError naming it.
    """

    devices: tuple[Device, ...]
    link_latency_s: LinkLatencies = field(default_factory=dict, hash=False, compare=False)
    latency: tuple[tuple[float, ...], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        devices = tuple(self.devices)
        object.__setattr__(self, "devices", devices)
        if not devices:
            raise ValueError("topology has no device")
        names = [d.name for d in devices]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate device names: {dupes}")
        n = len(devices)
        lat = [[0.0] * n for _ in range(n)]
        links = self.link_latency_s
        if isinstance(links, Mapping):
            index = {name: i for i, name in enumerate(names)}
            seen: dict[tuple[int, int], float] = {}
            for key, value in links.items():
                if not (isinstance(key, tuple) and len(key) == 2):
                    raise ValueError(f"link latency key must be a (device, device) pair, got {key!r}")
                unknown = [k for k in key if k not in index]
                if unknown:
                    raise ValueError(f"link latency {key!r} names unknown devices {unknown}; known: {names}")
                i, j = index[key[0]], index[key[1]]
                v = _latency_value(value, key)
                if i == j:
                    if v != 0:
                        raise ValueError(f"link latency of {key[0]!r} to itself must be 0, got {v}")
                    continue
                pair = (min(i, j), max(i, j))
                if pair in seen and seen[pair] != v:
                    raise ValueError(
                        f"link latency between {names[pair[0]]!r} and {names[pair[1]]!r} is not symmetric: "
                        f"{seen[pair]} vs {v}"
                    )
                seen[pair] = v
            for i in range(n):
                for j in range(i + 1, n):
                    if (i, j) not in seen:
                        raise ValueError(f"link latency missing for ({names[i]!r}, {names[j]!r})")
                    lat[i][j] = lat[j][i] = seen[(i, j)]
        else:
            rows = [list(r) for r in links]
            if len(rows) != n or any(len(r) != n for r in rows):
                raise ValueError(f"link latency matrix must be {n}x{n} (one row and column per device)")
            for i in range(n):
                for j in range(n):
                    v = _latency_value(rows[i][j], (names[i], names[j]))
                    if i == j and v != 0:
                        raise ValueError(f"link latency of {names[i]!r} to itself must be 0, got {v}")
                    if v != _latency_value(rows[j][i], (names[j], names[i])):
                        raise ValueError(
                            f"link latency matrix not symmetric between {names[i]!r} and {names[j]!r}"
                        )
                    lat[i][j] = v
        object.__setattr__(self, "latency", tuple(tuple(r) for r in lat))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    def link(self, a: str, b: str) -> float:
        """Latency(E[a][b]) in seconds."""
        names = self.names
        return self.latency[names.index(a)][names.index(b)]


def _latency_value(value: Any, key: tuple[str, str]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"link latency {key!r} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"link latency {key!r} must be finite and >= 0, got {v}")
    return v


@dataclass(frozen=True)
class LayeredModel:
    """A decoder-only model as HELR sees it: ``num_layers`` layers of ``layer_bytes`` plus the
    embedding (``embed_bytes``) and the final norm + untied lm_head (``head_bytes``);
    ``tied_embeddings``: the lm_head is the embedding tensor."""

    name: str
    num_layers: int
    layer_bytes: int
    embed_bytes: int = 0
    head_bytes: int = 0
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"model {self.name!r}: num_layers must be >= 1, got {self.num_layers}")
        if self.layer_bytes <= 0 or self.embed_bytes < 0 or self.head_bytes < 0:
            raise ValueError(f"model {self.name!r}: byte sizes must be positive: {self}")

    @property
    def total_bytes(self) -> int:
        """M, the model's memory requirement."""
        return self.num_layers * self.layer_bytes + self.embed_bytes + self.head_bytes

    @property
    def bytes_per_layer(self) -> float:
        """m = M / Layer(M) (Alg. 2 line 12)."""
        return self.total_bytes / self.num_layers

    @classmethod
    def from_arch(cls, arch: ModelArch) -> LayeredModel:
        b = arch.dtype_bytes
        final_norm = arch.hidden_size * (2 if arch.linear_bias else 1)
        lm_head = 0 if arch.tie_embeddings else arch.vocab_size * arch.hidden_size
        return cls(
            name=arch.name,
            num_layers=arch.num_layers,
            layer_bytes=arch.layer_params * b,
            embed_bytes=arch.embedding_params * b,
            head_bytes=(final_norm + lm_head) * b,
            tied_embeddings=arch.tie_embeddings,
        )

    @classmethod
    def from_hf_config(cls, config: Any, dtype: str = "float16", name: str | None = None) -> LayeredModel:
        """From a HF ``PretrainedConfig`` (or its dict), via :func:`arch_from_hf_config`."""
        return cls.from_arch(arch_from_hf_config(config, dtype=dtype, name=name))


def layered_model(name: str) -> LayeredModel:
    """A catalog model (``llmfleet.costmodel`` :func:`model_arch`) as a :class:`LayeredModel`."""
    return LayeredModel.from_arch(model_arch(name))
