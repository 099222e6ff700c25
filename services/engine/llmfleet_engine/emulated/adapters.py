"""LoRA adapters on an emulated engine: a pool of slots without weights and a "loader" that reads no
files, priced as the simulator prices them.

* **The pool** (:class:`EmulatedAdapterPool`) is the native ``AdapterPool``'s interface without
  weights: its :class:`~llmfleet.engine_core.AdapterSlots`, held through the engine core's adapter
  rule as the simulator's instances hold theirs (a request takes its adapter when the core admits it
  into a step and waits while every slot is held by other adapters' running requests), so a live
  emulated engine and a simulated instance load and evict the same adapters for the same requests.
* **Loading** an adapter into a slot costs :meth:`LoraCost.load_seconds
  <llmfleet.costmodel.lora.LoraCost.load_seconds>` at the adapter's rank; as in the simulator, the
  step that admitted its request waits for it (the load time is added to that step).
* **A step** adds :meth:`LoraCost.batch_seconds <llmfleet.costmodel.lora.LoraCost.batch_seconds>` of
  its adapter rows (:func:`~llmfleet.engine_core.adapter_rows`, the simulator's count) at the pool's
  ``max_lora_rank`` (the pool pads every adapter to it).
* **An adapter's rank** comes from its directory entry: ``emulated://rN`` (the scheme of an emulated
  model's source) is rank N; any other entry is the pool's ``max_lora_rank``. Nothing is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmfleet.costmodel.lora import LoraCost, declared_rank
from llmfleet.engine_core import AdapterSlots

from llmfleet_engine.lora import DEFAULT_TARGETS, AdapterError, LoraAdapter


def adapter_rank(path: str | Path, default: int) -> int:
    """The rank an adapter entry declares (``emulated://rN``, ``costmodel.lora.declared_rank``), else
    ``default``."""
    rank = declared_rank(str(path))
    return default if rank is None else rank


def emulated_adapter(
    name: str, path: str | Path, base: Any, *, max_rank: int, targets: frozenset[str]
) -> LoraAdapter:
    """``load_adapter``'s place on an emulated engine: no files, no weights, the entry's rank (AdapterError
    when it exceeds ``max_rank``, as natively)."""
    rank = adapter_rank(path, max_rank)
    if not 1 <= rank <= max_rank:
        raise AdapterError(f"adapter {name!r}: rank {rank} is outside 1..{max_rank} (max_lora_rank)")
    return LoraAdapter(name=name, path=str(path), rank=rank, weights={})


class EmulatedAdapterPool:
    """``max_adapters`` slots of one emulated base model (see the module docstring)."""

    def __init__(self, max_adapters: int, max_rank: int, cost: LoraCost) -> None:
        self.slots = AdapterSlots(max_adapters)
        self.max_adapters = max_adapters
        self.max_rank = max_rank
        self.targets = DEFAULT_TARGETS
        self.cost = cost
        self._load_debt = 0.0  # adapter load seconds the next step waits for

    def load(self, adapter: LoraAdapter, slot: int) -> None:
        """``adapter`` was put in ``slot`` as a step was scheduled: that step waits for its copy."""
        self._load_debt += self.cost.load_seconds(adapter.rank)

    def take_load_debt(self) -> float:
        """The load seconds owed since the last step (reset: the step that takes them pays them)."""
        debt, self._load_debt = self._load_debt, 0.0
        return debt
