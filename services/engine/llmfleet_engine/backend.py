"""The engine-backend boundary: what the gRPC servicer, the placement follower and ``main`` need from an
executor, as the parts they use.

* :class:`EngineBackend`: requests (submit, cancel, attach), device info, load snapshots, metrics and
  shutdown, with its parts ``host`` and ``migration``. The native paged executor
  (``executor.Executor``) and the vLLM adapter (``vllm_backend.VllmExecutor``) implement it.
* :class:`ModelHosting` (``EngineBackend.host``): the loaded models, loads, unloads and drains. The
  native executor's is its ``model_host.ModelHost``; the vLLM executor hosts its models itself.
* :class:`KvMigration` (``EngineBackend.migration``): live KV export and import. The native executor's
  is its ``migration_ops.MigrationOps``; the vLLM backend has none (None: it migrates by re-prefill).
* :class:`LoraBackend`: a backend serving LoRA adapters on its base models, with their registry in
  ``adapters`` (:class:`AdapterHosting`): the native executor's ``lora.hosting.AdapterHost``, the vLLM
  executor's ``vllm_adapters.VllmAdapters``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from llmfleet.types import ModelSpec

from llmfleet_engine.models import LoadedModel
from llmfleet_engine.outputs import LoadResult, LoadSnapshot
from llmfleet_engine.stream import RequestStream
from llmfleet_engine.transfer import ImportTarget
from llmfleet_engine.validation import GenerationRequest

if TYPE_CHECKING:
    from llmfleet.metrics.engine import EngineMetrics

    from llmfleet_engine.profiling import ProfileResult
    from llmfleet_engine.transfer import ImportHandle, TransferHeader


class ModelHosting(Protocol):
    """The models of an engine node: what is loaded, loads and unloads, and drains (a draining model
    keeps running its requests but is not advertised, and its new requests are refused)."""

    on_models_changed: list[Callable[[tuple[str, ...]], None]]

    @property
    def kv_capacity_bytes(self) -> int: ...

    @property
    def models(self) -> dict[str, LoadedModel]: ...

    def model_names(self) -> tuple[str, ...]: ...

    def load(self, spec: ModelSpec) -> LoadResult: ...

    def unload(self, name: str) -> bool: ...

    def begin_drain(self, name: str, reason: str) -> bool: ...

    def end_drain(self, name: str) -> bool: ...

    def draining_reason(self, name: str) -> str | None: ...

    def serving_model_names(self) -> tuple[str, ...]:
        """Loaded models that take new requests: what the node record advertises."""
        ...

    def model_request_ids(self, name: str) -> list[str]: ...

    def evict(self, request_id: str, reason: str) -> bool: ...

    def take_eviction(self, request_id: str) -> str | None: ...


class KvMigration(ImportTarget, Protocol):
    """Live migration of a request's KV (Mell's KV transfer; token transfer without KV): the source side
    pauses, exports and finishes it, the destination imports it (``transfer.ImportHandle``)."""

    def pause_request(
        self, request_id: str, timeout_s: float = 30.0, *, moving_to: str = ""
    ) -> TransferHeader: ...

    def resume_request(self, request_id: str, *, moving: bool = False) -> bool: ...

    def export_kv(self, request_id: str, start: int, end: int) -> bytes: ...

    def wire_bytes_per_token(self, header: TransferHeader) -> int: ...

    def finish_migrated(self, request_id: str, destination: str) -> None: ...

    def begin_import(self, header: TransferHeader) -> ImportHandle: ...


@runtime_checkable
class EngineBackend(Protocol):
    """Generate, cancel, device info, load snapshots; the models in ``host``, KV migration in
    ``migration`` (None: the backend has no KV transfer)."""

    backend: str
    device: str
    memory_bytes: int

    @property
    def host(self) -> ModelHosting: ...

    @property
    def migration(self) -> KvMigration | None: ...

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue a validated request (from a running event loop); its chunk stream."""
        ...

    def cancel(self, request_id: str) -> bool: ...

    def attach(self, request_id: str) -> RequestStream | None:
        """The stream of a migrated-in request nobody consumes yet (None when there is none)."""
        ...

    def cancel_if_unattached(self, request_id: str) -> bool: ...

    def load_snapshot(self) -> LoadSnapshot: ...

    def attach_metrics(self, metrics: EngineMetrics) -> None:
        """Export the ``vllm:*`` metrics (gauges from the load snapshot, counters from requests)."""
        ...

    async def aclose(self) -> None: ...


class AdapterHosting(Protocol):
    """The LoRA adapters of an engine: declared with their base, registered while it is loaded."""

    def add(self, name: str, base: str, path: str | Path) -> object:
        """Declares adapter ``name`` of ``base`` in directory ``path`` (``lora.AdapterError``: refused)."""
        ...

    def remove(self, name: str) -> bool:
        """Forgets adapter ``name`` (``lora.AdapterError`` while requests hold it on the native engine)."""
        ...

    def base_of(self, name: str) -> str | None: ...

    def serving(self, bases: tuple[str, ...]) -> tuple[str, ...]:
        """``bases`` and their registered adapters: what the node record advertises."""
        ...

    def with_adapters(self, models: dict[str, LoadedModel]) -> dict[str, LoadedModel]:
        """``models`` plus each registered adapter mapped to its base's loaded model."""
        ...


@runtime_checkable
class LoraBackend(Protocol):
    """A backend whose requests may name a LoRA adapter, run on its base."""

    @property
    def adapters(self) -> AdapterHosting: ...


@runtime_checkable
class ProfilingBackend(Protocol):
    """A backend that answers Profile sweeps (native: timed forwards; emulated: the cost model)."""

    def profile(self, model: str, **sweep: object) -> ProfileResult: ...


@runtime_checkable
class EmulatedLink(Protocol):
    """A migration whose KV link is emulated: a probe received here takes ``link_seconds(bytes)``."""

    def link_seconds(self, nbytes: int) -> float: ...
