"""The interface of migration policies (Mell's packing, Llumnix-style load balancing, none).

Once per epoch the coordinator (live) or the simulator hands a policy the cluster's per-request KV
state — :class:`GpuState` per engine/instance with its :class:`RequestState` s — and gets back an
:class:`EpochPlan`: the migrations to run and the GPUs to activate (leave the idle pool) or
deactivate (return to it). Policies are pure and may keep state between epochs (Mell keeps its GPU
types and activation order); they never talk to an engine.

A :class:`TransferPlanner` (``hybrid_transfer``) then decides *how* each migration moves — its KV over
the link, or its tokens with a re-prefill at the destination — within per-epoch budgets, and defers
what fits neither.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

TransferMode = Literal["kv", "tokens"]


@dataclass(frozen=True)
class RequestState:
    """A running request as its engine reports it: KV bytes held now and context tokens (prompt +
    generated; what a re-prefill would recompute). ``model`` is the model whose KV it holds; a request
    of a LoRA adapter names it in ``adapter`` and runs on ``model``, its base."""

    request_id: str
    model: str
    kv_bytes: int
    tokens: int = 0
    adapter: str = ""

    @property
    def served_as(self) -> str:
        """What a destination must serve to take it: its LoRA adapter, else its model. Policies place it
        only on a GPU listing that name in ``GpuState.models``."""
        return self.adapter or self.model


@dataclass(frozen=True)
class GpuState:
    """One engine (a Mell "GPU"): the models it serves (the models it hosts and the LoRA adapters
    registered on them, as its node record advertises them), its KV capacity C in bytes, its running
    requests, whether it is active (not in the idle pool), and its machine (host) for Mell's
    same-machine priority."""

    gpu_id: str
    models: tuple[str, ...]
    capacity_bytes: int
    requests: tuple[RequestState, ...] = ()
    active: bool = True
    machine: str = ""

    @property
    def used_bytes(self) -> int:
        return sum(r.kv_bytes for r in self.requests)

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes


@dataclass(frozen=True)
class Migration:
    """Move ``request_id`` from ``source`` to ``destination``. ``migration_id`` is deterministic
    (request, source, destination, epoch), so a retried or re-planned move is recognisable."""

    migration_id: str
    request_id: str
    model: str
    source: str
    destination: str
    kv_bytes: int
    tokens: int = 0
    mode: TransferMode = "kv"


@dataclass(frozen=True)
class EpochPlan:
    """One epoch's decisions. ``operations``: Allocate/Depart/Update operations run (Mell);
    ``cancelled``: migrations removed by operation batching; ``deferred``: migrations the transfer
    planner could not fit this epoch (they are re-planned next epoch)."""

    migrations: tuple[Migration, ...] = ()
    activate: tuple[str, ...] = ()
    deactivate: tuple[str, ...] = ()
    deferred: tuple[Migration, ...] = ()
    operations: int = 0
    cancelled: int = 0
    notes: tuple[str, ...] = ()


@runtime_checkable
class MigrationPolicy(Protocol):
    """Per epoch: the cluster's state in, the plan out (pure; may keep state between epochs)."""

    def epoch(self, gpus: Sequence[GpuState], now: float) -> EpochPlan: ...


@dataclass(frozen=True)
class TransferBudget:
    """Per-epoch capacities of the two "bins" of hybrid migration (Mell §hybrid migration).

    ``link_bytes[(src, dst)]``: bytes a link moves within one epoch (its communication boundary;
    ``default_link_bytes`` for links not measured). ``prefill_tokens[gpu]``: tokens of re-prefill a
    destination absorbs within one epoch without slowing its batch (its computation boundary, from the
    cost model at its batch size; ``default_prefill_tokens`` otherwise)."""

    link_bytes: Mapping[tuple[str, str], float] = field(default_factory=dict)
    default_link_bytes: float = 0.0
    prefill_tokens: Mapping[str, float] = field(default_factory=dict)
    default_prefill_tokens: float = 0.0

    def link(self, source: str, destination: str) -> float:
        return self.link_bytes.get((source, destination), self.default_link_bytes)

    def prefill(self, gpu: str) -> float:
        return self.prefill_tokens.get(gpu, self.default_prefill_tokens)


@runtime_checkable
class TransferPlanner(Protocol):
    """Choose each migration's mode within ``budget``; returns (scheduled with modes, deferred)."""

    def assign(
        self, migrations: Sequence[Migration], budget: TransferBudget
    ) -> tuple[tuple[Migration, ...], tuple[Migration, ...]]: ...


def migration_id(request_id: str, source: str, destination: str, epoch: int) -> str:
    """The deterministic id of a migration planned in ``epoch``."""
    return f"{request_id}:{source}->{destination}#{epoch}"
