"""LoRA adapter slots and the engine core's rule for them: which adapters of a base model are resident,
which are held by running requests, which goes next, and when a request may run.

:class:`AdapterSlots` is one base model's pool as bookkeeping (pure: no weights, no clock), with the
rules every engine follows (the simulator's instances, the emulated engines and the native engine,
whose ``llmfleet_engine.lora.AdapterPool`` keeps its weights in the slots this object hands out):

* ``slots`` adapters at most (``max_loras``), each in a numbered slot (0 .. slots − 1, the lowest free
  one first); an adapter a request names is put in a free slot, else in the slot of the least recently
  used adapter that no request holds (an eviction), and counted as a load (a copy from host memory to
  the device);
* a running request holds (pins) its adapter; an adapter used again becomes the most recently used.

:class:`AdapterGate` is where the engine core (:class:`~llmfleet.engine_core.core.EngineCore`) applies
them. A request acquires its adapter when the core admits it into a step (its prefill, a static batch,
a landing with its KV), not when it arrives, and releases it when it leaves the running set: finished,
failed, cancelled, migrated away, preempted (it acquires it again when it is admitted again) or
re-queued at a static batch's end. A waiting request whose adapter finds every slot held by other
adapters' running requests stays waiting, never refused; the policy does not see it meanwhile, so
later requests whose adapter is resident or has a free slot go ahead (vLLM's scheduler skips such a
request the same way). A request of a higher priority that waits so may preempt the running requests
of one other adapter instead, and then takes the freed slot before its prefill
(:meth:`~llmfleet.engine_core.core.EngineCore.preemption_victims`). The engine says where a base's slots are and what a load does (the simulator
and the emulated engine charge its time, the native engine copies the weights in).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from llmfleet.engine_core.request import CoreRequest, StepPlan


class AdapterUnavailable(RuntimeError):
    """A waiting request's adapter cannot be served here any more (removed, its base has no adapter
    pool): the core fails the request with this message."""


class AdapterSlots:
    """``slots`` LoRA adapter slots of one base model, LRU with pins (see the module docstring)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"an adapter pool needs at least one slot, got {slots}")
        self.slots = slots
        self._resident: OrderedDict[str, int] = OrderedDict()  # adapter -> requests holding it, LRU first
        self._slot: dict[str, int] = {}  # resident adapter -> its slot
        self._free = list(range(slots - 1, -1, -1))  # pop() hands out the lowest slot first
        self.loads = 0  # adapters put in a slot so far
        self.evictions = 0

    @property
    def resident(self) -> tuple[str, ...]:
        """The resident adapters, least recently used first."""
        return tuple(self._resident)

    def holds(self, adapter: str) -> bool:
        return adapter in self._resident

    def slot(self, adapter: str) -> int | None:
        """The slot ``adapter`` occupies, or None when it is not resident."""
        return self._slot.get(adapter)

    def pins(self, adapter: str) -> int:
        """Requests holding ``adapter`` now."""
        return self._resident.get(adapter, 0)

    def acquire(self, adapter: str) -> bool | None:
        """A request of ``adapter`` is admitted: pin it, putting it in a slot if it is not resident.
        True when it was put in a slot now (a load), False when it was resident, None when every slot
        is held by requests of other adapters (nothing changes)."""
        pins = self._resident.get(adapter)
        if pins is not None:
            self._resident[adapter] = pins + 1
            self._resident.move_to_end(adapter)
            return False
        if self._free:
            slot = self._free.pop()
        else:
            victim = next((a for a, n in self._resident.items() if n == 0), None)
            if victim is None:
                return None
            del self._resident[victim]
            slot = self._slot.pop(victim)
            self.evictions += 1
        self._resident[adapter] = 1
        self._slot[adapter] = slot
        self.loads += 1
        return True

    def release(self, adapter: str) -> None:
        """A request of ``adapter`` left the running set: its pin goes (the adapter stays resident)."""
        pins = self._resident.get(adapter)
        if pins:
            self._resident[adapter] = pins - 1

    def remove(self, adapter: str) -> bool:
        """Drops ``adapter`` from its slot (ValueError while a request holds it); True when it was resident."""
        if self._resident.get(adapter):
            raise ValueError(f"adapter {adapter!r} is in use by running requests")
        if self._resident.pop(adapter, None) is None:
            return False
        self._free.append(self._slot.pop(adapter))
        self._free.sort(reverse=True)
        return True

    def room(self, adapter: str) -> bool:
        """Whether :meth:`acquire` of ``adapter`` would succeed now."""
        return (
            adapter in self._resident
            or len(self._resident) < self.slots
            or any(n == 0 for n in self._resident.values())
        )


# the slots of a request's base model (None: its base has no adapter pool here)
SlotsOf = Callable[[CoreRequest], AdapterSlots | None]
# an adapter was put in ``slot`` for request ``r`` (AdapterUnavailable: it cannot be; the load is undone)
OnLoad = Callable[[CoreRequest, int], None]


class AdapterGate:
    """The engine core's adapter admission (see the module docstring): ``slots_of`` finds a request's
    base pool, ``on_load`` is told of each adapter put in a slot."""

    def __init__(self, slots_of: SlotsOf, on_load: OnLoad | None = None) -> None:
        self.slots_of = slots_of
        self.on_load = on_load

    def room(self, r: CoreRequest) -> bool:
        """Whether ``r`` (naming an adapter) could acquire it now; True when it cannot be served at all
        (its admission fails it)."""
        slots = self.slots_of(r)
        return slots is None or slots.room(r.adapter or "")

    def acquire(self, r: CoreRequest) -> int | None:
        """Pin ``r``'s adapter, loading it if it is not resident: its slot, or None when every slot is
        held by other adapters' requests (``r`` waits). AdapterUnavailable when it cannot be served."""
        adapter = r.adapter or ""
        slots = self.slots_of(r)
        if slots is None:
            raise AdapterUnavailable(
                f"adapter {adapter!r}: base model {r.sched.model!r} has no adapter pool here"
            )
        got = slots.acquire(adapter)
        if got is None:
            return None
        slot = slots.slot(adapter)
        assert slot is not None
        if got and self.on_load is not None:
            try:
                self.on_load(r, slot)
            except AdapterUnavailable:
                slots.release(adapter)
                slots.remove(adapter)
                raise
        return slot

    def release(self, r: CoreRequest) -> None:
        """``r`` left the running set: its pin goes."""
        slots = self.slots_of(r)
        if slots is not None:
            slots.release(r.adapter or "")


def adapter_rows(plan: StepPlan) -> tuple[int, int]:
    """The rows of ``plan`` that name an adapter (a prefill's computed prompt tokens, a decode's one
    token) and the distinct adapters among them: what ``LoraCost.batch_seconds`` prices."""
    tokens, names = 0, set()
    prefills = {id(r) for r in plan.prefills}
    for r in plan.members:
        adapter = r.adapter
        if adapter:
            names.add(adapter)
            tokens += r.sched.prompt_tokens - r.cached if id(r) in prefills else 1
    return tokens, len(names)
