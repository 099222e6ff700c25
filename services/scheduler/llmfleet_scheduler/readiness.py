"""Ready means servable: the scheduler's readiness — gRPC health of
``llmfleet.v1.Scheduler`` and HTTP ``/ready`` — is SERVING only when every configured service has a
live engine with its model loaded, except services marked ``scale_to_zero`` and services whose model
the placement leader says it will not place (``llmfleet.coord.unplaced``). ``""`` (the overall
gRPC health) and HTTP ``/health`` stay liveness: the process is up and answering.

:class:`Readiness` follows the services and nodes views and sets the health status when the answer
changes; ``llmfleet up`` waits on it and shows what is missing meanwhile. Readiness is a start-up gate:
once servable, the scheduler stays ready while it is connected to etcd. A service applied later, or one
whose engines went away, does not take it back (that would stop traffic to every other service): its
requests wait for placement instead (scale from zero, ``capacity.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from llmfleet.spec.services import ServiceSpec
from llmfleet.types import NodeRecord

from llmfleet_scheduler.directory import ClusterDirectory

log = logging.getLogger(__name__)


def unserved(services: Mapping[str, ServiceSpec], engines: Iterable[NodeRecord]) -> list[str]:
    """Services (by name) that must be served and that no engine serves: their model is loaded on no
    engine. Services marked ``scale_to_zero`` never count."""
    loaded = {m for n in engines for m in n.models}
    return sorted(n for n, s in services.items() if not s.scale_to_zero and s.model not in loaded)


@dataclass
class Readiness:
    directory: ClusterDirectory
    set_status: Callable[[bool], Awaitable[None]]  # the health status to publish (True: SERVING)
    # whether services/ was seeded from the cluster config (before that, there is nothing to serve
    # yet, not "nothing to wait for"); None: do not ask
    seeded: Callable[[], Awaitable[bool]] | None = None
    servable: bool = False
    _seeded: bool = False
    missing: list[str] = field(default_factory=list)

    def check(self) -> tuple[bool, list[str]]:
        """(servable, what is missing); not connected to etcd yet, or services/ not seeded yet, counts
        as not servable."""
        if not self.directory.ready:
            return False, ["(not connected to etcd yet)"]
        if self.servable:  # latched (module docstring)
            return True, []
        if self.seeded is not None and not self._seeded:
            return False, ["(services not seeded by placement yet)"]
        missing = unserved(self.directory.services(), self.directory.engines().values())
        services = self.directory.services()
        # a service whose model the placement leader says it will not place never gets an engine:
        # waiting for it would hold readiness forever (its requests fail at once, naming why)
        missing = [n for n in missing if self.directory.unplaced(services[n].model) is None]
        return not missing, missing

    async def refresh(self) -> None:
        if self.seeded is not None and not self._seeded and self.directory.ready:
            try:
                self._seeded = await self.seeded()
            except Exception as e:  # etcd hiccup: not ready yet, ask again next time
                log.debug("readiness: reading the seed marker failed: %s", e)
        ok, missing = self.check()
        self.missing = missing
        if ok != self.servable:
            self.servable = ok
            log.info(
                "scheduler %s: %s",
                "ready" if ok else "not ready",
                "every service has an engine" if ok else "no engine serves " + ", ".join(missing),
            )
            await self.set_status(ok)

    async def follow(self) -> None:
        """Re-check whenever the services or the nodes change (and once a second regardless)."""
        await self.set_status(False)
        views = [v for v in (self.directory.services_view, self.directory.nodes_view) if v is not None]
        changed = asyncio.Event()

        async def pump(view) -> None:
            async for _ in view.subscribe():
                changed.set()

        pumps = [asyncio.create_task(pump(v)) for v in views]
        try:
            while True:
                await self.refresh()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 1.0)
                changed.clear()
        finally:
            for p in pumps:
                p.cancel()
