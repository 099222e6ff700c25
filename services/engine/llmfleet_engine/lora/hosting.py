"""``AdapterHost``: the LoRA adapters a native engine serves, each on a base model it hosts.

``add(name, base, path)`` declares the adapter and, once ``base`` is hosted (now, or when it is loaded
later: the model host's change hook), reads and checks it from disk (blocking: call it off the event
loop) without holding the executor's lock, so the running requests never wait for it, and registers
it; its weights stay in host memory. A base unloaded takes its adapters' registrations with it; a base
loaded again registers its declared adapters again. A request naming the adapter runs on the base.
The engine core's adapter rule (:class:`~llmfleet.engine_core.AdapterGate`, over each base pool's
``slots``, found by ``slots_of``) gives it a slot of the base's ``AdapterPool`` when the core admits
it into a step, putting the adapter in a free slot or evicting the least recently used adapter no
running request holds, and ``load`` copies the weights into that slot; the request holds it until it
leaves the running set. A request whose adapter finds every slot held by other adapters' running
requests waits in the core. Loads run on the worker thread as a step is scheduled, between forwards,
so no forward reads the columns being written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmfleet.engine_core import AdapterSlots, AdapterUnavailable, CoreRequest

from llmfleet_engine.lora.adapter import AdapterError, LoraAdapter, load_adapter
from llmfleet_engine.lora.pool import AdapterPool

if TYPE_CHECKING:
    from llmfleet_engine.hosted_model import HostedModel
    from llmfleet_engine.model_host import ModelHost
    from llmfleet_engine.models import LoadedModel
    from llmfleet_engine.request_table import RequestTable


def pool_of(hosted: HostedModel | None) -> AdapterPool | None:
    """The adapter pool of a hosted model (None: not hosted or LoRA off); an emulated model's is an
    ``EmulatedAdapterPool`` (the same interface over slots without weights)."""
    return None if hosted is None else getattr(hosted.runner, "lora", None)


# reads and checks adapter ``name`` at ``path`` for a base's loaded model (``load_adapter``'s signature)
AdapterLoader = Callable[..., LoraAdapter]


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegisteredAdapter:
    base: str
    adapter: LoraAdapter


class AdapterHost:
    """The registered adapters (name -> base and weights) of the models ``host`` hosts."""

    def __init__(self, table: RequestTable, host: ModelHost, loader: AdapterLoader = load_adapter) -> None:
        self.table = table
        self.host = host
        self.loader = loader
        self.registered: dict[str, RegisteredAdapter] = {}
        self.declared: dict[str, tuple[str, str | Path]] = {}  # name -> (base, directory)
        host.on_models_changed.append(self._bases_changed)

    def _pool(self, base: str, name: str) -> AdapterPool:
        hosted = self.host.hosted.get(base)
        if hosted is None:
            raise AdapterError(f"adapter {name!r}: base model {base!r} is not loaded here")
        pool = pool_of(hosted)
        if pool is None:
            raise AdapterError(f"adapter {name!r}: LoRA is off on this engine (max_loras 0)")
        return pool

    def add(self, name: str, base: str, path: str | Path) -> LoraAdapter | None:
        """Declares adapter ``name`` of ``base`` at ``path``; when ``base`` is hosted, reads it and
        registers it now (again: replaced), else returns None (registered when ``base`` is loaded).
        AdapterError naming the problem; the engine keeps serving."""
        with self.table.cond:
            self.declared[name] = (base, path)
            if base not in self.host.hosted:
                return None
        adapter = self._register(name, base, path)
        for changed in self.host.on_models_changed:  # the node record advertises the adapter
            if changed != self._bases_changed:
                changed(self.serving(self.host.serving_model_names()))
        return adapter

    def _bases_changed(self, _names: tuple[str, ...]) -> None:
        """The hosted models changed (called off the event loop): registrations of a base that left
        go; declared adapters of a hosted base are registered (a bad one is logged)."""
        with self.table.cond:
            hosted = self.host.hosted
            for name in [n for n, e in self.registered.items() if e.base not in hosted]:
                del self.registered[name]
            due = [
                (n, b, p) for n, (b, p) in self.declared.items() if b in hosted and n not in self.registered
            ]
        for name, base, path in due:
            try:
                self._register(name, base, path)
            except AdapterError as e:
                log.error("%s", e)

    def _register(self, name: str, base: str, path: str | Path) -> LoraAdapter:
        with self.table.cond:
            if name in self.host.hosted:
                raise AdapterError(f"adapter {name!r}: a model of that name is loaded here")
            pool = self._pool(base, name)
            model = self.host.hosted[base].loaded.model
        adapter = self.loader(name, path, model, max_rank=pool.max_rank, targets=pool.targets)
        with self.table.cond:
            if self._pool(base, name) is not pool:
                raise AdapterError(f"adapter {name!r}: base model {base!r} was reloaded meanwhile")
            self._unregister(name)  # registered again: the new weights replace the old
            self.registered[name] = RegisteredAdapter(base, adapter)
        return adapter

    def remove(self, name: str) -> bool:
        """Forgets adapter ``name`` and frees its slot (AdapterError while a request holds it)."""
        with self.table.cond:
            self._unregister(name)
            return self.declared.pop(name, None) is not None

    def _unregister(self, name: str) -> None:
        entry = self.registered.get(name)
        if entry is None:
            return
        pool = pool_of(self.host.hosted.get(entry.base))
        if pool is not None:
            if pool.slots.pins(name):
                raise AdapterError(f"adapter {name!r} is in use by running requests")
            pool.slots.remove(name)
        del self.registered[name]

    def base_of(self, name: str) -> str | None:
        """The base model of adapter ``name``, or None when ``name`` is not an adapter here."""
        entry = self.registered.get(name)
        return None if entry is None else entry.base

    def slots_of(self, r: CoreRequest) -> AdapterSlots | None:
        """Under the table's lock (the engine core's adapter rule asks it): the adapter slots of the
        base ``r`` runs on (None: not hosted, or LoRA off)."""
        pool = pool_of(self.host.hosted.get(r.sched.model))
        return None if pool is None else pool.slots

    def load(self, r: CoreRequest, slot: int) -> None:
        """Under the table's lock, as the core admits ``r`` into a step (between forwards): its
        adapter was given ``slot``; the base's pool copies its weights in. AdapterUnavailable when
        the adapter is no longer registered on that base (removed while ``r`` waited)."""
        name, base = r.adapter or "", r.sched.model
        entry = self.registered.get(name)
        pool = pool_of(self.host.hosted.get(base))
        if entry is None or entry.base != base or pool is None:
            raise AdapterUnavailable(f"adapter {name!r} of {base!r} is no longer registered here")
        try:
            pool.load(entry.adapter, slot)
        except ValueError as e:
            raise AdapterUnavailable(str(e)) from None

    def serving(self, bases: tuple[str, ...]) -> tuple[str, ...]:
        """``bases`` (the models taking requests) and the registered adapters of those bases, sorted:
        what the node record advertises."""
        with self.table.cond:
            adapters = [n for n, e in self.registered.items() if e.base in bases]
        return tuple(sorted([*bases, *adapters]))

    def with_adapters(self, models: dict[str, LoadedModel]) -> dict[str, LoadedModel]:
        """``models`` (the loaded models by name) plus each registered adapter of one of them, mapped
        to its base's loaded model (its tokenizer and limits validate the adapter's requests)."""
        with self.table.cond:
            extra = {n: models[e.base] for n, e in self.registered.items() if e.base in models}
        return {**models, **extra}

    def resident(self, base: str) -> list[str]:
        """The adapters of ``base`` in its pool now, least recently used first."""
        with self.table.cond:
            pool = pool_of(self.host.hosted.get(base))
            return [] if pool is None else list(pool.slots.resident)
