"""The engine-backend boundary: what the gRPC servicer, the placement follower and ``main`` need from an
executor. The native paged executor (``executor.Executor``) and the vLLM adapter
(``vllm_backend.VllmExecutor``) both implement :class:`EngineBackend`; the native one also implements
:class:`KvMigrationBackend` (live KV export/import), which the servicer checks by type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from llmfleet.types import ModelSpec

from llmfleet_engine.models import LoadedModel
from llmfleet_engine.outputs import LoadResult, LoadSnapshot, ReconcileResult
from llmfleet_engine.stream import RequestStream
from llmfleet_engine.validation import GenerationRequest

if TYPE_CHECKING:
    from llmfleet.metrics.engine import EngineMetrics

    from llmfleet_engine.profiling import ProfileResult
    from llmfleet_engine.transfer import ImportHandle, TransferHeader


@runtime_checkable
class EngineBackend(Protocol):
    """Generate, cancel, load/unload, info and load snapshots."""

    backend: str
    device: str
    memory_bytes: int
    on_models_changed: list[Callable[[tuple[str, ...]], None]]

    @property
    def kv_capacity_bytes(self) -> int: ...

    @property
    def models(self) -> dict[str, LoadedModel]: ...

    def model_names(self) -> tuple[str, ...]: ...

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue a validated request (from a running event loop); its chunk stream."""
        ...

    def cancel(self, request_id: str) -> bool: ...

    def attach(self, request_id: str) -> RequestStream | None:
        """The stream of a migrated-in request nobody consumes yet (None when there is none)."""
        ...

    def cancel_if_unattached(self, request_id: str) -> bool: ...

    def load(self, spec: ModelSpec) -> LoadResult: ...

    def unload(self, name: str) -> bool: ...

    def reconcile(self, desired: Iterable[ModelSpec]) -> ReconcileResult: ...

    def load_snapshot(self) -> LoadSnapshot: ...

    def attach_metrics(self, metrics: EngineMetrics) -> None:
        """Export the ``vllm:*`` metrics (gauges from the load snapshot, counters from requests)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class KvMigrationBackend(EngineBackend, Protocol):
    """A backend whose requests' KV can be exported and imported (live migration, Mell's KV transfer)
    and whose unified pool is described by blocks."""

    def tokens_per_block(self, model: str) -> int: ...

    def reserved_bytes(self, model: str) -> int: ...

    def pause_request(
        self, request_id: str, timeout_s: float = 30.0, *, moving_to: str = ""
    ) -> TransferHeader: ...

    def resume_request(self, request_id: str, *, moving: bool = False) -> bool: ...

    def export_kv(self, request_id: str, start: int, end: int) -> bytes: ...

    def wire_bytes_per_token(self, header: TransferHeader) -> int: ...

    def check_chunk(self, header: TransferHeader, start: int, num_tokens: int, data: bytes) -> None: ...

    def finish_migrated(self, request_id: str, destination: str) -> None: ...

    def begin_import(self, header: TransferHeader) -> ImportHandle: ...

    def write_import(self, handle: ImportHandle, start: int, data: bytes) -> None: ...

    def commit_import(self, handle: ImportHandle, loop: asyncio.AbstractEventLoop) -> None: ...

    def abort_import(self, handle: ImportHandle) -> None: ...


@runtime_checkable
class ProfilingBackend(Protocol):
    """A backend that answers Profile sweeps (native: timed forwards; emulated: the cost model)."""

    def profile(self, model: str, **sweep: object) -> ProfileResult: ...


@runtime_checkable
class EmulatedLink(Protocol):
    """A backend whose KV link is emulated: a probe received here takes ``link_seconds(bytes)``."""

    def link_seconds(self, nbytes: int) -> float: ...
