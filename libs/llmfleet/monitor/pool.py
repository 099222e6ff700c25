"""The engine pool: every live engine with its hardware, memory and GPUs, and which of them are idle.

An engine is *in use* when it hosts a model or its placement gives it one (a model being loaded or
drained still holds its GPUs); otherwise it is *idle*: GPUs the fleet does not use. GPUs in use =
Σ tp over the engines in use; GPUs total = Σ tp over every live engine.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmfleet.costmodel.hardware import HARDWARE_CATALOG
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, NodeRecord


@dataclass(frozen=True)
class PoolEngine:
    engine_id: str
    address: str = ""
    hardware: str = ""
    device: str = ""
    memory_bytes: int = 0
    tp: int = 1
    models: tuple[str, ...] = ()  # loaded
    desired: tuple[str, ...] = ()  # given by its placement key

    @property
    def idle(self) -> bool:
        return not self.models and not self.desired


@dataclass(frozen=True)
class EnginePool:
    engines: tuple[PoolEngine, ...] = ()

    @property
    def gpus_total(self) -> int:
        return sum(e.tp for e in self.engines)

    @property
    def gpus_in_use(self) -> int:
        return sum(e.tp for e in self.engines if not e.idle)

    @property
    def idle(self) -> tuple[PoolEngine, ...]:
        return tuple(e for e in self.engines if e.idle)


def engine_pool(
    nodes: Iterable[NodeRecord], desired: Mapping[str, DesiredPlacement] | None = None
) -> EnginePool:
    """The pool from the live node records (engines only) and the desired placements."""
    desired = desired or {}
    engines = []
    for n in sorted((n for n in nodes if n.role == ENGINE_ROLE), key=lambda n: n.node_id):
        want = desired.get(n.node_id)
        engines.append(
            PoolEngine(
                engine_id=n.node_id,
                address=n.address,
                hardware=n.hardware,
                device=n.device,
                memory_bytes=n.memory_bytes,
                tp=max(int(n.tp), 1),
                models=tuple(n.models),
                desired=tuple(m.name for m in want.models) if want is not None else (),
            )
        )
    return EnginePool(tuple(engines))


def _tokens(text: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", text.lower())) - {""}


_MEMORY = re.compile(r"^\d+gb$")


def guess_hardware(device_name: str, memory_bytes: int = 0) -> str | None:
    """The catalog name of a GPU from its driver name (``torch.cuda.get_device_name``), or None.

    A catalog entry matches when its name's tokens other than the memory size (``a100`` of
    ``a100-80gb``; ``rtx``, ``4090`` of ``rtx-4090``) all appear among the device name's tokens
    (``NVIDIA A100-SXM4-80GB``). Among several, one whose memory token also appears wins, else the
    one whose memory is closest to ``memory_bytes``.
    """
    have = _tokens(device_name)
    found = []
    for name, hw in HARDWARE_CATALOG.items():
        toks = _tokens(name)
        base = {t for t in toks if not _MEMORY.match(t)}
        if base and base <= have:
            found.append((not (toks - base) <= have, abs(hw.mem_bytes - memory_bytes), name))
    return min(found)[2] if found else None
