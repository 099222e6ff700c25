"""The slots of one base model's LoRA adapter pool, as bookkeeping: which adapters are resident, which
are held by requests, which goes next. Pure (no weights, no clock): the simulator's instances and the
emulated engines keep one per base model, with the native engine's rules (``llmfleet_engine.lora.pool``):

* ``slots`` adapters at most (``max_loras``); an adapter a request names is put in a free slot, else
  in the slot of the least recently used adapter that no request holds (an eviction), and counted as
  a load (a copy from host memory to the device);
* a request holds (pins) its adapter from its admission until it ends; an adapter used again becomes
  the most recently used;
* when every slot is held by requests of other adapters, :meth:`acquire` returns None and the caller
  makes the request wait (the native engine refuses it ``RESOURCE_EXHAUSTED``, and the scheduler
  places it again; a simulated instance keeps it until a slot frees).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from llmfleet.engine_core.request import CoreRequest, StepPlan


class AdapterSlots:
    """``slots`` LoRA adapter slots of one base model, LRU with pins (see the module docstring)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"an adapter pool needs at least one slot, got {slots}")
        self.slots = slots
        self._resident: OrderedDict[str, int] = OrderedDict()  # adapter -> requests holding it, LRU first
        self.loads = 0  # adapters put in a slot so far
        self.evictions = 0

    @property
    def resident(self) -> tuple[str, ...]:
        """The resident adapters, least recently used first."""
        return tuple(self._resident)

    def holds(self, adapter: str) -> bool:
        return adapter in self._resident

    def pins(self, adapter: str) -> int:
        """Requests holding ``adapter`` now."""
        return self._resident.get(adapter, 0)

    def acquire(self, adapter: str) -> bool | None:
        """A request of ``adapter`` arrives: pin it, loading it if it is not resident. True when it was
        loaded now (a miss), False when it was resident, None when every slot is held by others."""
        pins = self._resident.get(adapter)
        if pins is not None:
            self._resident[adapter] = pins + 1
            self._resident.move_to_end(adapter)
            return False
        if len(self._resident) >= self.slots:
            victim = next((a for a, n in self._resident.items() if n == 0), None)
            if victim is None:
                return None
            del self._resident[victim]
            self.evictions += 1
        self._resident[adapter] = 1
        self.loads += 1
        return True

    def release(self, adapter: str) -> None:
        """A request of ``adapter`` ended: its pin goes (the adapter stays resident)."""
        pins = self._resident.get(adapter)
        if pins:
            self._resident[adapter] = pins - 1

    def remove(self, adapter: str) -> bool:
        """Drops ``adapter`` from its slot (ValueError while a request holds it); True when it was resident."""
        if self._resident.get(adapter):
            raise ValueError(f"adapter {adapter!r} is in use by running requests")
        return self._resident.pop(adapter, None) is not None

    def room(self, adapter: str) -> bool:
        """Whether :meth:`acquire` of ``adapter`` would succeed now."""
        return (
            adapter in self._resident
            or len(self._resident) < self.slots
            or any(n == 0 for n in self._resident.values())
        )


def adapter_rows(plan: StepPlan, adapter_of: Callable[[CoreRequest], str | None]) -> tuple[int, int]:
    """The rows of ``plan`` that name an adapter (a prefill's computed prompt tokens, a decode's one
    token) and the distinct adapters among them: what ``LoraCost.batch_seconds`` prices."""
    tokens, names = 0, set()
    prefills = {id(r) for r in plan.prefills}
    for r in plan.members:
        adapter = adapter_of(r)
        if adapter:
            names.add(adapter)
            tokens += r.sched.prompt_tokens - r.cached if id(r) in prefills else 1
    return tokens, len(names)
