"""The emulated pool's storage: block bookkeeping only (``BlockAllocator``), no K/V tensors."""

from __future__ import annotations

from llmfleet.kvblocks import KvShape


class NoKvStorage:
    """Stands where ``KvStorage`` holds the K/V tensors: remembers which models are registered."""

    device = "emulated"

    def __init__(self) -> None:
        self.shapes: dict[str, KvShape] = {}

    def register(self, name: str, shape: KvShape) -> None:
        self.shapes[name] = shape

    def unregister(self, name: str) -> None:
        self.shapes.pop(name, None)
