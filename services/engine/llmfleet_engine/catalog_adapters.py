"""Adapters learnt from etcd's model catalog (``models/``, ``ModelEntry`` with ``base`` and ``adapter``):
an entry ``llmfleet apply`` adds at runtime is declared on this engine's adapter registry (the native
``lora.hosting.AdapterHost`` or the vLLM ``vllm_adapters.VllmAdapters``) as ``--adapter`` would have
declared it at start, so it registers now if its base is loaded here and whenever the base is loaded
later; a changed entry is declared again, a deleted one forgotten.

Reading and checking an adapter blocks (its files, a few ms); it runs in a worker thread, outside the
executor's lock, so the engine's other requests never wait for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

from llmfleet.coord.desired import ModelEntry

from llmfleet_engine.backend import AdapterHosting
from llmfleet_engine.lora import AdapterError

log = logging.getLogger(__name__)


class CatalogView(Protocol):
    """The model catalog's view (``llmfleet.coord.model_view``): one snapshot per change."""

    def subscribe(self) -> AsyncIterator[tuple[int, dict[str, ModelEntry]]]: ...


class CatalogAdapters:
    """Declares the catalog's adapter entries on ``adapters``. ``declared``: the adapters the engine's
    flags declared (name -> (base, directory)), which the catalog repeats and are not declared again;
    ``forgotten``: called (in the event loop) after adapters were forgotten, so that the node record
    stops advertising them (a declared adapter is advertised by the registry's own change hook)."""

    def __init__(
        self,
        adapters: AdapterHosting,
        declared: Mapping[str, tuple[str, str]] = {},
        forgotten: Callable[[], None] = lambda: None,
    ) -> None:
        self.adapters = adapters
        self.forgotten = forgotten
        self.declared: dict[str, tuple[str, str]] = dict(declared)
        self.learnt: set[str] = set()  # names declared from the catalog (forgotten when it drops them)

    async def run(self, view: CatalogView) -> None:
        async for _revision, entries in view.subscribe():
            await self.sync(entries)

    async def sync(self, entries: Mapping[str, ModelEntry]) -> None:
        """Declares the new and changed adapter entries of ``entries`` and forgets the ones gone."""
        wanted = {n: (e.base, e.adapter) for n, e in entries.items() if e.base and e.adapter}
        for name, where in sorted(wanted.items()):
            if self.declared.get(name) == where:
                continue
            self.declared[name] = where
            self.learnt.add(name)
            try:
                added = await asyncio.to_thread(self.adapters.add, name, *where)
            except (AdapterError, OSError, ValueError) as e:
                log.error("model catalog: %s", e)
                continue
            log.info("model catalog: adapter %s of %s declared (%s)", name, where[0], added and "registered")
        gone = sorted(self.learnt - set(wanted))
        for name in gone:
            self.learnt.discard(name)
            self.declared.pop(name, None)
            try:
                await asyncio.to_thread(self.adapters.remove, name)
            except AdapterError as e:
                log.error("model catalog: %s", e)
        if gone:
            self.forgotten()
