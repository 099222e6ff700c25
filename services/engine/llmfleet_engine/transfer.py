"""KV export/import for live migration (Mell's "KV transfer"; token transfer when no KV is held).

The wire-level state of a request in transit, over the executor's public primitives
(``llmfleet_engine.migration_ops``): source side ``pause_request`` → ``export_kv`` → ``finish_migrated``
(or ``resume_request`` when the transfer failed); destination side ``begin_import`` →
``ImportHandle.write`` → ``commit`` (the request lands in the engine core, its chunks buffered until a
consumer ``attach``es) or ``abort``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from llmfleet.kvblocks import KvShape

from llmfleet_engine.outputs import TransferError
from llmfleet_engine.sampling import SamplingConfig


@dataclass(frozen=True)
class TransferHeader:
    """Token state of a request in transit; its K/V for ``num_tokens`` tokens follows as chunks.
    ``model``: the model whose KV it holds; ``adapter``: the LoRA adapter it runs with on that model
    ("": none), which the destination must have registered on it."""

    request_id: str
    model: str
    shape: KvShape
    num_tokens: int
    prompt: str
    prompt_token_ids: tuple[int, ...]
    generated_token_ids: tuple[int, ...]
    sampling: SamplingConfig
    service: str = ""
    rng_state: bytes = b""
    age_s: float = 0.0
    source_engine_id: str = ""
    adapter: str = ""


class ImportTarget(Protocol):
    """What an :class:`ImportHandle` writes into (the native executor's public import primitives)."""

    def check_chunk(self, header: TransferHeader, start: int, num_tokens: int, data: bytes) -> None:
        """Raise ``TransferError`` unless ``data`` is the wire form of tokens [start, start+num_tokens)."""
        ...

    def write_import(self, handle: ImportHandle, start: int, data: bytes) -> None: ...

    def commit_import(self, handle: ImportHandle, loop: asyncio.AbstractEventLoop) -> None: ...

    def abort_import(self, handle: ImportHandle) -> None: ...


@dataclass
class ImportHandle:
    """Blocks reserved for an incoming request; fill them with ``write``, then ``commit`` or ``abort``."""

    ex: ImportTarget
    header: TransferHeader
    blocks: tuple[int, ...]
    received: int = 0
    done: bool = field(default=False, repr=False)

    def write(self, start: int, num_tokens: int, data: bytes) -> None:
        h = self.header
        if start != self.received or start + num_tokens > h.num_tokens or num_tokens <= 0:
            raise TransferError(
                f"chunk [{start}, {start + num_tokens}) out of order: expected start {self.received}, "
                f"{h.num_tokens} tokens in all"
            )
        self.ex.check_chunk(h, start, num_tokens, data)
        self.ex.write_import(self, start, data)
        self.received += num_tokens

    def commit(self, loop: asyncio.AbstractEventLoop) -> None:
        """Adopt the request: it decodes from where the source stopped; output waits for ``attach``."""
        h = self.header
        if self.received != h.num_tokens:
            self.abort()
            raise TransferError(
                f"import of {h.request_id!r} incomplete: {self.received}/{h.num_tokens} tokens"
            )
        self.ex.commit_import(self, loop)

    def abort(self) -> None:
        self.ex.abort_import(self)
