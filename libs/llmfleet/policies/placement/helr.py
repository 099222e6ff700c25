"""UELLM's LLM deployer: HELR device subset, pipeline order and layer → device map.

He et al. 2024 (UELLM), §4.3, Algorithm 2, Eqs. 4–6. Given devices ``D`` with ``Memory(d)``,
``Performance(d)`` and link latencies ``Latency(E[i][j])``, and a model of ``M`` bytes in ``Layer(M)``
layers, HELR picks a subset ``S ⊆ D`` and a pipeline order of ``S`` and assigns consecutive layers to
the devices in that order. With ``m = M / Layer(M)`` (Alg. 2 line 12: embeddings and head are spread
over the layers) and ``T`` the memory reserved for the KV cache on each device:

* capacity (Alg. 2 line 16): ``cap(d) = min(Layer(M), ⌊(Memory(d) − T) / m⌋)`` layers;
* layers (lines 11, 16): devices of ``S`` sorted by performance, then memory, descending, each takes
  ``min(cap(d), layers left)``; ``S`` is admissible when every layer is placed (which implies Eq. 4,
  ``Σ_S Memory ≥ M + |S|·T``) and every device of ``S`` gets at least one layer (a device left empty
  is not part of the pipeline: the same plan without it is considered as its own subset);
* latency of order ``π`` of ``S`` (Eq. 6): ``T(S, π) = Σ_{d∈S} p·layers(d)·m / Performance(d)
  + Σ_k Latency(π_k, π_{k+1})`` — a pipeline is a path, not a tour, so no edge back to the start;
* Held-Karp (Eq. 5): ``dp[mask][i] = min_j dp[mask∖{i}][j] + Latency(j, i)``, the cheapest path
  through exactly ``mask`` ending at ``i``, one table for all subsets, O(2^n·n²). The compute term of
  Eq. 5 depends on ``S`` only (not on the order), so it is added once per subset instead of per step.

Objective. The paper trades latency against the number of devices with weights ``a1`` (latency, the
option ``latency_weight``) and ``a2`` (devices, ``device_weight``) without writing the sum; we use, for
admissible ``(S, π)``::

    J(S, π) = a1 · T(S, π) / T*  +  a2 · |S| / k*

with ``T*`` the lowest latency and ``k*`` the fewest devices over all admissible plans (both terms
dimensionless, 1 at their own optimum). Modes (§4.3): HE ``a1 = 0`` (fewest devices; ties broken by
latency), LR ``a1:a2 = 10:1``, HELR ``1:1`` (the paper's "balanced", its value not given). Ties on
``J`` go to the lower latency, then to fewer devices; among equal-latency orders of one subset the DP
keeps the first found, reversed when its last device outranks its first (links are symmetric).

``performance`` is relative (higher = faster); ``p`` (the option ``compute_scale``) converts ``layers·m / performance`` into seconds
("adjusts processing performance-time relationship"): with ``p = 1`` give performance in bytes of
weights processed per second. Pure: no I/O, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llmfleet.policies.placement.base import PlacementInfeasible
from llmfleet.policies.placement.device_topology import Device, LayeredModel, Topology, layered_model

MODES = ("he", "lr", "helr")
# (a1, a2) per mode: a1 weighs latency, a2 the number of devices (§4.3)
MODE_WEIGHTS: dict[str, tuple[float, float]] = {"he": (0.0, 1.0), "lr": (10.0, 1.0), "helr": (1.0, 1.0)}
MAX_DEVICES = 16  # Held-Karp is O(2^n·n²): "fine for a handful of GPUs"


@dataclass(frozen=True)
class HelrPlan:
    """HELR's answer: the pipeline ``order``, layers per device (in order), the transformers
    ``device_map``, the objective ``J`` and the latency ``T(S, π)`` (compute + links, Eq. 6)."""

    model: str
    mode: str
    order: tuple[str, ...]
    layers: tuple[int, ...]
    device_map: dict[str, str] = field(hash=False)
    objective: float
    latency_s: float
    compute_s: float
    link_s: float

    @property
    def layers_per_device(self) -> dict[str, int]:
        return dict(zip(self.order, self.layers, strict=True))

    def device_map_pairs(self) -> tuple[tuple[str, str], ...]:
        """The map as ``ModelSpec.device_map`` carries it."""
        return tuple(self.device_map.items())


def assign_layers(
    topology: Topology, model: LayeredModel, subset: Sequence[int], kv_reserve_bytes: int = 0
) -> dict[int, int]:
    """Alg. 2 lines 11 and 16: layers per device index of ``subset``, greedily by capacity on the
    devices sorted by performance then memory (descending). Fewer than ``Layer(M)`` placed in total
    means the subset cannot hold the model."""
    m = model.bytes_per_layer
    left = model.num_layers
    out: dict[int, int] = {}
    ranked = sorted(subset, key=lambda i: _rank_key(topology, i))
    for i in ranked:
        take = min(left, _capacity(topology.devices[i], model, m, kv_reserve_bytes))
        out[i] = take
        left -= take
    return out


def _rank_key(topology: Topology, i: int) -> tuple[float, int, int]:
    d = topology.devices[i]
    return (-d.performance, -d.memory_bytes, i)


def _capacity(device: Device, model: LayeredModel, m: float, kv_reserve_bytes: int) -> int:
    usable = device.memory_bytes - kv_reserve_bytes
    if usable <= 0:
        return 0
    return min(model.num_layers, math.floor(usable / m))


# transformers' module names (the Llama family in transformers >= 4.45, where ``model.rotary_emb`` is a
# module: it goes with the embedding on the first device)
FIRST_MODULES = ("model.embed_tokens", "model.rotary_emb")
LAYER_PREFIX = "model.layers"
LAST_MODULES = ("model.norm", "lm_head")
TIED_HEAD = "lm_head"  # with tied embeddings it is the embedding tensor: it stays on the first device


@dataclass(frozen=True)
class HelrOptions:
    """HELR's options: ``mode`` (one of :data:`MODES`) gives the objective's weights, which
    ``latency_weight`` (a1) and ``device_weight`` (a2) override; ``compute_scale`` (p) converts
    ``layers·m / performance`` into seconds (Eq. 5); ``kv_reserve_bytes`` (T) is the memory kept for the
    KV cache on every device used."""

    mode: str = "helr"
    latency_weight: float | None = None
    device_weight: float | None = None
    compute_scale: float = 1.0
    kv_reserve_bytes: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown HELR mode {self.mode!r}; valid: {list(MODES)}")
        a1, a2 = self.weights
        if a1 < 0 or a2 < 0 or a1 + a2 == 0:
            raise ValueError(
                f"HELR weights must be >= 0 and not both 0, got latency_weight={a1}, device_weight={a2}"
            )
        if not math.isfinite(self.compute_scale) or self.compute_scale < 0:
            raise ValueError(f"compute_scale must be finite and >= 0, got {self.compute_scale}")
        if self.kv_reserve_bytes < 0:
            raise ValueError(f"kv_reserve_bytes must be >= 0, got {self.kv_reserve_bytes}")

    @property
    def weights(self) -> tuple[float, float]:
        """(a1, a2): the mode's weights, each overridden when set."""
        a1, a2 = MODE_WEIGHTS[self.mode]
        return (
            a1 if self.latency_weight is None else float(self.latency_weight),
            a2 if self.device_weight is None else float(self.device_weight),
        )


class HelrPlanner:
    """HELR (Algorithm 2) with ``options``. The device map's first modules go to the first device, the
    last ones to the last; with tied embeddings the head is the embedding tensor, so it stays on the
    first device: the last stage sends its normed hidden states back there (a hop Eq. 6 does not count).
    """

    name: ClassVar[str] = "helr"
    Options: ClassVar[type[HelrOptions]] = HelrOptions

    def __init__(self, options: HelrOptions | None = None) -> None:
        o = options if options is not None else HelrOptions()
        self.mode = o.mode
        self.weights = o.weights
        self.compute_scale = o.compute_scale
        self.kv_reserve_bytes = o.kv_reserve_bytes

    def device_map(self, topology: Topology, model: LayeredModel | str) -> HelrPlan:
        """The best plan under :meth:`objective`; raises PlacementInfeasible when the model fits no
        subset (naming the model and the shortfall)."""
        if isinstance(model, str):
            model = layered_model(model)
        n = len(topology.devices)
        if n > MAX_DEVICES:
            raise ValueError(f"HELR's Held-Karp DP handles at most {MAX_DEVICES} devices, got {n}")
        self._check_feasible(topology, model)
        dp, parent = held_karp(topology.latency)
        m = model.bytes_per_layer
        candidates: list[tuple[int, float, float, int]] = []  # (mask, compute, links, end)
        for mask in range(1, 1 << n):
            subset = [i for i in range(n) if mask >> i & 1]
            layers = assign_layers(topology, model, subset, self.kv_reserve_bytes)
            if sum(layers.values()) < model.num_layers or min(layers.values()) == 0:
                continue
            compute = sum(
                self.compute_scale * layers[i] * m / topology.devices[i].performance for i in subset
            )  # order-independent part of Eq. 5/6
            row = dp[mask]
            end = min(subset, key=lambda i: row[i])
            candidates.append((mask, compute, row[end], end))
        t_best = min(c + lk for _, c, lk, _ in candidates)
        k_best = min(mask.bit_count() for mask, *_ in candidates)
        best: tuple[Any, ...] | None = None
        for mask, compute, links, end in candidates:
            order = _path(parent, mask, end)
            t = compute + links
            key = (self.objective(t, mask.bit_count(), t_best, k_best), t, mask.bit_count(), order)
            if best is None or key < best[0]:
                best = (key, compute, links)
        assert best is not None
        (objective, latency, _, order), compute, links = best
        if _rank_key(topology, order[-1]) < _rank_key(topology, order[0]):
            order = order[::-1]  # same latency (links are symmetric): start on the faster device
        layers = assign_layers(topology, model, order, self.kv_reserve_bytes)
        names = tuple(topology.devices[i].name for i in order)
        counts = tuple(layers[i] for i in order)
        return HelrPlan(
            model=model.name,
            mode=self.mode,
            order=names,
            layers=counts,
            device_map=self.build_device_map(names, counts, tied=model.tied_embeddings),
            objective=objective,
            latency_s=latency,
            compute_s=compute,
            link_s=links,
        )

    def objective(self, latency_s: float, num_devices: int, best_latency_s: float, fewest: int) -> float:
        """J = a1·T/T* + a2·|S|/k* (see the module doc; T* = 0 leaves T unnormalised)."""
        a1, a2 = self.weights
        return a1 * latency_s / (best_latency_s or 1.0) + a2 * num_devices / fewest

    def build_device_map(
        self, order: Sequence[str], layers: Sequence[int], tied: bool = False
    ) -> dict[str, str]:
        """transformers' ``device_map``: first modules on ``order[0]``, consecutive layers per device
        in pipeline order, last modules on ``order[-1]`` (a tied head on ``order[0]``)."""
        out = {name: order[0] for name in FIRST_MODULES}
        k = 0
        for dev, count in zip(order, layers, strict=True):
            for _ in range(count):
                out[f"{LAYER_PREFIX}.{k}"] = dev
                k += 1
        out.update({name: order[-1] for name in LAST_MODULES})
        if tied and TIED_HEAD in out:
            out[TIED_HEAD] = order[0]
        return out

    def _check_feasible(self, topology: Topology, model: LayeredModel) -> None:
        m = model.bytes_per_layer
        t = self.kv_reserve_bytes
        usable = {d.name: d.memory_bytes - t for d in topology.devices}
        largest = max(usable, key=lambda k: usable[k])
        if usable[largest] < m:
            raise PlacementInfeasible(
                f"model {model.name!r}: one layer needs {m:.0f} B (M/Layer(M)) but the largest device "
                f"{largest!r} has {max(usable[largest], 0)} B after the {t} B KV reserve "
                f"(short by {m - max(usable[largest], 0):.0f} B)"
            )
        caps = sum(_capacity(d, model, m, t) for d in topology.devices)
        if caps < model.num_layers:
            need = model.total_bytes + len(topology.devices) * t
            have = sum(d.memory_bytes for d in topology.devices)
            short = model.num_layers - caps
            raise PlacementInfeasible(
                f"model {model.name!r}: {model.total_bytes} B in {model.num_layers} layers does not fit: "
                f"all devices together hold {caps} layers of {m:.0f} B after a {t} B KV reserve each, "
                f"short by {short} layers ≈ {short * m:.0f} B (memory {have} B, needed {need} B)"
            )


def held_karp(latency: Sequence[Sequence[float]]) -> tuple[list[list[float]], list[list[int]]]:
    """Eq. 5 over all subsets at once: ``dp[mask][i]`` = least link latency of a path visiting
    exactly ``mask`` and ending at ``i`` (inf when ``i ∉ mask``), ``parent`` its predecessor (-1 at
    the start). O(2^n·n²)."""
    n = len(latency)
    full = 1 << n
    inf = math.inf
    dp = [[inf] * n for _ in range(full)]
    parent = [[-1] * n for _ in range(full)]
    for i in range(n):
        dp[1 << i][i] = 0.0
    for mask in range(1, full):
        row = dp[mask]
        for i in range(n):
            cost = row[i]
            if cost == inf:
                continue
            li = latency[i]
            for j in range(n):
                if mask >> j & 1:
                    continue
                nxt = mask | 1 << j
                v = cost + li[j]
                if v < dp[nxt][j]:
                    dp[nxt][j] = v
                    parent[nxt][j] = i
    return dp, parent


def _path(parent: list[list[int]], mask: int, end: int) -> tuple[int, ...]:
    out = [end]
    while parent[mask][end] >= 0:
        prev = parent[mask][end]
        mask &= ~(1 << end)
        end = prev
        out.append(end)
    return tuple(reversed(out))


__all__ = [
    "MODES",
    "MODE_WEIGHTS",
    "HelrOptions",
    "HelrPlan",
    "HelrPlanner",
    "assign_layers",
    "held_karp",
]
