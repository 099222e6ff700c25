"""``AdapterPool``: a bounded set of LoRA adapters resident on one base model, one slot each.

``AdapterPool.attach(model, ...)`` replaces the base's target Linear modules (``q_proj``, ``v_proj``
...) of every decoder layer with ``LoraLinear`` modules that read the pool's stacked weights, so all
adapters of the base (and the base itself) run in one batch. Which adapter is in which slot is decided
by ``slots`` (:class:`~llmfleet.engine_core.AdapterSlots`, LRU with pins), through the engine core's
adapter rule: when the core admits a request whose adapter is not resident, it takes a free slot or
evicts the least recently used adapter no running request holds, and ``load`` copies the adapter's
weights in (the adapter was read from disk beforehand, ``load_adapter``, off the step loop: loading is
a copy of a few small tensors). ``step_mask`` turns each token's slot (-1 for the base) into the
``StepMask`` the modules use for one forward.

Not thread-safe: the engine's step loop owns the pool (loads happen as a step is scheduled, between
forwards).
"""

from __future__ import annotations

from typing import Any

import torch
from llmfleet.engine_core import AdapterSlots

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
        self.slots = AdapterSlots(max_adapters)  # which adapter is in which slot (the engine core's rule)

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
    def load(self, adapter: LoraAdapter, slot: int) -> None:
        """Copies ``adapter``'s weights into ``slot`` (the one ``slots`` gave it), replacing what was
        there. ValueError for a rank above the pool's or a module the pool does not hold
        (``load_adapter`` checks both first)."""
        if adapter.rank > self.max_rank:
            raise ValueError(
                f"adapter {adapter.name!r}: rank {adapter.rank} exceeds the pool's {self.max_rank}"
            )
        missing = sorted(set(adapter.weights) - set(self.modules))
        if missing:
            raise ValueError(f"adapter {adapter.name!r}: modules {missing} are not LoRA targets of this pool")
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
