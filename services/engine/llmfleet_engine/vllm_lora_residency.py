"""Which LoRA adapters one model's vLLM engine holds: vLLM's ``list_loras()`` (the ids in its adapter
cache), asked again in the engine's event loop after a request of an adapter gets its first token (by
then vLLM has loaded that adapter, evicting another if its cache was full), so the load report reads
vLLM's own answer without waiting on the engine.

The order is the adapters' last requests here (least recently used first, as the native pool's);
``loads`` counts the ids that appeared between two answers (vLLM does not count its loads).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class LoraResidency:
    """The adapter ids a vLLM engine holds, as its ``list_loras`` last said. ``refresh`` runs in the
    engine's event loop; the rest from any thread."""

    def __init__(
        self,
        list_loras: Callable[[], Awaitable[set[int]]],
        *,
        hidden: frozenset[int] = frozenset(),
        min_interval_s: float = 0.05,
    ) -> None:
        self._list_loras = list_loras
        self.hidden = hidden  # ids that are no adapter of the engine's (the zero adapter)
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._resident: frozenset[int] = frozenset()
        self._used: dict[int, int] = {}  # id -> the sequence number of its last request
        self._sequence = itertools.count()
        self._loads = 0
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def used(self, lora_id: int) -> None:
        """A request of adapter ``lora_id`` starts (its place in the least-recently-used order)."""
        with self._lock:
            self._used[lora_id] = next(self._sequence)

    def refresh(self) -> None:
        """In the engine's event loop: ask vLLM again; one question in flight, and one more after it
        (at least ``min_interval_s`` later) when asked meanwhile."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._again = False
        self._task = asyncio.get_running_loop().create_task(self._ask())

    async def _ask(self) -> None:
        while True:
            try:
                ids = frozenset(int(i) for i in await self._list_loras()) - self.hidden
            except asyncio.CancelledError:
                raise
            except Exception:
                log.debug("vLLM's list_loras failed", exc_info=True)
                return
            with self._lock:
                self._loads += len(ids - self._resident)
                self._resident = ids
            if not self._again:
                return
            self._again = False
            await asyncio.sleep(self.min_interval_s)

    def cancel(self) -> None:
        """In the engine's event loop: stop a question in flight (the engine shuts down)."""
        if self._task is not None:
            self._task.cancel()

    def resident(self) -> list[int]:
        """The ids vLLM holds, least recently used first."""
        with self._lock:
            return sorted(self._resident, key=lambda i: self._used.get(i, -1))

    @property
    def loads(self) -> int:
        with self._lock:
            return self._loads
