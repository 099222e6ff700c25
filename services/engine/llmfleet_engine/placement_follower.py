"""Reconcile the engine's loaded models to its desired state in etcd (``placement/{engine_id}``).

No key for this engine means "no opinion": whatever is loaded stays. A key means exactly those
models: missing ones are loaded, others unloaded. Loading runs in a worker thread; changes that
arrive meanwhile coalesce into one more pass; failed loads are retried with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from llmfleet.coord import PrefixView
from llmfleet.types import DesiredPlacement

from llmfleet_engine.backend import EngineBackend

log = logging.getLogger(__name__)


@dataclass
class PlacementFollower:
    engine_id: str
    executor: EngineBackend
    retry_s: float = 5.0
    applied: DesiredPlacement | None = None

    async def run(self, view: PrefixView[DesiredPlacement]) -> None:
        """Follow ``view`` forever."""
        changed = asyncio.Event()

        async def pump() -> None:
            async for _ in view.subscribe():
                changed.set()

        pump_task = asyncio.create_task(pump())
        try:
            while True:
                changed.clear()  # before reading, so a change during apply() triggers another pass
                desired = view.snapshot().get(self.engine_id)
                ok = True
                if desired is not None and desired != self.applied:
                    ok = await self.apply(desired)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=None if ok else self.retry_s)
        finally:
            pump_task.cancel()

    async def apply(self, desired: DesiredPlacement) -> bool:
        result = await asyncio.to_thread(self.executor.reconcile, desired.models)
        if result.loaded or result.unloaded:
            log.info("%s: loaded %s, unloaded %s", self.engine_id, result.loaded, result.unloaded)
        if result.errors:
            log.error("%s: could not load %s; retrying in %.0fs", self.engine_id, result.errors, self.retry_s)
            return False
        self.applied = desired
        return True
