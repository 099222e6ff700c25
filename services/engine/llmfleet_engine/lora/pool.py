"""``AdapterPool``: a bounded set of LoRA adapters resident on one base model, one slot each.

``AdapterPool.attach(model, ...)`` replaces the base's target Linear modules (``q_proj``, ``v_proj``
...) of every decoder layer with ``LoraLinear`` modules that read the pool's stacked weights, so all
adapters of the base (and the base itself) run in one batch. Slots are reused in LRU order: ``insert``
takes a free slot, else evicts the least recently used adapter that no running request pins, and
copies the adapter's weights in (the adapter was read from disk beforehand, ``load_adapter``, off the
step loop: inserting is a copy of a few small tensors). ``step_mask`` turns each token's slot (-1 for
the base) into the ``StepMask`` the modules use for one forward.

Not thread-safe: the engine's step loop owns the pool (inserts happen between forwards).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from llmfleet_engine.lora.adapter import LoraAdapter
from llmfleet_engine.lora.linear import LoraLinear, StepMask

DEFAULT_TARGETS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})


def pool_bytes(
    model: Any, max_adapters: int, max_rank: int, targets: frozenset[str] = DEFAULT_TARGETS
) -> int:
    """The bytes ``AdapterPool.attach`` allocates on ``model``: ``max_adapters · max_rank · (in + out)``
    elements per target Linear."""
    elem = next(model.parameters()).element_size()
    total = 0
    for path, m in model.named_modules():
        if path.rsplit(".", 1)[-1] in targets and isinstance(m, torch.nn.Linear | LoraLinear):
            total += (m.in_features + m.out_features) * max_adapters * max_rank * elem
    return total


class AdapterPoolFull(RuntimeError):
    """Every slot holds an adapter a running request pins."""


class AdapterPool:
    """``max_adapters`` slots of rank up to ``max_rank`` over ``modules`` (path -> ``LoraLinear``)."""

    def __init__(
        self, modules: dict[str, LoraLinear], step: StepMask, max_adapters: int, max_rank: int
    ) -> None:
        if max_adapters < 1 or max_rank < 1:
            raise ValueError(
                f"an adapter pool needs max_adapters >= 1 and max_rank >= 1; got {max_adapters}, {max_rank}"
            )
        self.modules = modules
        self.step = step
        self.max_adapters = max_adapters
        self.max_rank = max_rank
        self.targets = frozenset(path.rsplit(".", 1)[-1] for path in modules)
        first = next(iter(modules.values()))
        self._slot_of_col = torch.arange(max_adapters, device=first.lora_a.device).repeat_interleave(max_rank)
        self._dtype = first.lora_a.dtype
        self._slots: OrderedDict[str, int] = OrderedDict()  # resident adapter -> slot, least recent first
        self._pins: dict[str, int] = {}
        self._free = list(range(max_adapters - 1, -1, -1))  # pop() hands out the lowest slot first
        self.loads = 0
        self.evictions = 0

    @classmethod
    def attach(
        cls, model: Any, *, max_adapters: int, max_rank: int, targets: frozenset[str] = DEFAULT_TARGETS
    ) -> AdapterPool:
        """Wraps ``targets`` of every decoder layer of ``model`` (a Llama-family HF causal LM) in
        ``LoraLinear`` modules over zeroed stacked weights and returns their pool."""
        step = StepMask()
        param = next(model.parameters())
        width = max_adapters * max_rank
        modules: dict[str, LoraLinear] = {}
        for path, parent in list(model.named_modules()):
            for leaf, child in list(parent.named_children()):
                if isinstance(child, LoraLinear):  # attached before (the model was loaded again)
                    child = child.base
                if leaf not in targets or type(child) is not torch.nn.Linear:
                    continue
                a = torch.zeros(child.in_features, width, dtype=param.dtype, device=param.device)
                b = torch.zeros(width, child.out_features, dtype=param.dtype, device=param.device)
                wrapped = LoraLinear(child, a, b, step)
                setattr(parent, leaf, wrapped)
                modules[f"{path}.{leaf}" if path else leaf] = wrapped
        if not modules:
            raise ValueError(f"the model has no Linear module named one of {sorted(targets)}")
        return cls(modules, step, max_adapters, max_rank)

    # ------------------------------------------------------------------ slots
    def slot(self, name: str) -> int | None:
        """The slot ``name`` occupies, or None when it is not resident."""
        return self._slots.get(name)

    @property
    def resident(self) -> list[str]:
        """The resident adapters, least recently used first."""
        return list(self._slots)

    def pinned(self, name: str) -> bool:
        return self._pins.get(name, 0) > 0

    def pin(self, name: str) -> int:
        """Marks ``name`` in use by a request (it is not evicted until unpinned) and returns its slot."""
        slot = self._slots[name]
        self._slots.move_to_end(name)
        self._pins[name] = self._pins.get(name, 0) + 1
        return slot

    def unpin(self, name: str) -> None:
        n = self._pins[name] - 1
        if n:
            self._pins[name] = n
        else:
            del self._pins[name]

    def insert(self, adapter: LoraAdapter) -> int:
        """The slot of ``adapter``, copying its weights into a free or evicted slot when it is not
        resident. AdapterPoolFull when every slot is pinned; ValueError for a rank above the pool's or
        a module the pool does not hold (``load_adapter`` checks both first)."""
        slot = self._slots.get(adapter.name)
        if slot is not None:
            self._slots.move_to_end(adapter.name)
            return slot
        if adapter.rank > self.max_rank:
            raise ValueError(
                f"adapter {adapter.name!r}: rank {adapter.rank} exceeds the pool's {self.max_rank}"
            )
        missing = sorted(set(adapter.weights) - set(self.modules))
        if missing:
            raise ValueError(f"adapter {adapter.name!r}: modules {missing} are not LoRA targets of this pool")
        slot = self._take_slot(adapter.name)
        lo, hi = slot * self.max_rank, (slot + 1) * self.max_rank
        with torch.no_grad():
            for path, m in self.modules.items():
                m.lora_a[:, lo:hi].zero_()
                m.lora_b[lo:hi].zero_()
                pair = adapter.weights.get(path)
                if pair is not None:
                    a, b = pair
                    r = a.shape[0]
                    m.lora_a[:, lo : lo + r].copy_(a.T)
                    m.lora_b[lo : lo + r].copy_(b.T)
        self._slots[adapter.name] = slot
        self.loads += 1
        return slot

    def acquire(self, adapter: LoraAdapter) -> int:
        """:meth:`insert` then :meth:`pin`: the slot of a request's adapter, held until :meth:`unpin`."""
        self.insert(adapter)
        return self.pin(adapter.name)

    def _take_slot(self, name: str) -> int:
        if self._free:
            return self._free.pop()
        for victim in self._slots:  # least recently used first
            if not self.pinned(victim):
                self.evictions += 1
                return self._slots.pop(victim)
        raise AdapterPoolFull(
            f"adapter {name!r}: all {self.max_adapters} adapter slots are in use by running requests"
        )

    def remove(self, name: str) -> None:
        """Drops ``name`` (not pinned) from the pool; its slot is free again."""
        if self.pinned(name):
            raise ValueError(f"adapter {name!r} is in use by running requests")
        slot = self._slots.pop(name, None)
        if slot is not None:
            self._free.append(slot)

    # ------------------------------------------------------------------ steps
    def step_mask(self, token_slots: list[int] | None) -> None:
        """Sets the mask of the next forward from each token's slot (-1: the base); None clears it."""
        top = -1 if not token_slots else max(token_slots)
        if top < 0:
            self.step.set(None)
            return
        cols = self._slot_of_col[: (top + 1) * self.max_rank]
        tok = torch.tensor(token_slots, device=cols.device)
        self.step.set((tok[:, None] == cols[None, :]).to(self._dtype))
