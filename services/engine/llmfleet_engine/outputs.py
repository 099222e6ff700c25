"""What an executor hands out: stream chunks, usage, load snapshots, errors (shared by backends)."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from llmfleet_engine.models import LoadedModel


class FinishReason(enum.IntEnum):
    """Why a stream ended; values equal ``llmfleet.v1.FinishReason``."""

    LENGTH = 1
    STOP = 2
    EOS = 3
    CANCELLED = 4
    ERROR = 5
    MIGRATED = 6


class ExecutorClosedError(RuntimeError):
    """The executor is shut down."""


class DuplicateRequestError(ValueError):
    """A request with this id is already active."""


class QueueFullError(RuntimeError):
    """The waiting queue is at ``max_waiting``."""


class ResourceExhaustedError(RuntimeError):
    """The request (or import, or model) can never fit the engine's memory; the message has the sizes."""


class TransferError(RuntimeError):
    """A KV export/import/migration cannot proceed (unknown request, model or shape mismatch)."""


class RequestNotFoundError(TransferError):
    """The request to export or migrate is not active on this engine (finished, moved, never here)."""


class MigrationConflictError(TransferError):
    """The request is already being migrated (by another migration)."""


class ModelConflictError(ValueError):
    """A model of this name is already loaded from a different source or dtype."""


@dataclass(frozen=True)
class EngineUsage:
    """Final accounting of a request by the engine (its clock: arrival -> queue exit / first / last
    token); ``completion_tokens`` includes resumed tokens. Sent as ``llmfleet.v1.Usage``; not the SDK's
    ``llmfleet.client.Usage``."""

    prompt_tokens: int
    completion_tokens: int
    queue_s: float
    ttft_s: float
    latency_s: float
    cached_tokens: int = 0  # prompt tokens its first prefill found in the prefix cache


@dataclass(frozen=True)
class EngineChunk:
    """One increment of a request's stream out of an executor; ``index`` is the completion position of
    ``token_ids[0]``. Sent as ``llmfleet.v1.TokenChunk``; not the SDK's ``llmfleet.client.Chunk``."""

    request_id: str
    index: int
    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None
    usage: EngineUsage | None = None
    migrated_to: str = ""  # with FinishReason.MIGRATED: the destination engine's address

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class ModelLoad:
    model: str
    running: int
    waiting: int
    kv_tokens: int
    kv_used_bytes: int
    kv_blocks: int = 0
    tokens_per_block: int = 0
    adapters: tuple[str, ...] = ()  # LoRA adapters resident in its adapter pool, least recently used first
    adapter_loads: int = 0  # adapters copied into its pool so far
    adapter_slots: int = 0  # its adapter pool's slots (max_loras; 0: LoRA off)


@dataclass(frozen=True)
class RequestLoads:
    """Per-request load, one column per field and one row per request the engine holds (no object per
    request: a snapshot is taken often). ``tokens``: context (prompt + generated); ``kv_bytes``: the KV
    it holds now; ``phases``: "waiting", "prefill" (its prompt is being computed) or "decode";
    ``models``: the model whose KV it holds, its base for a request of a LoRA adapter, named in
    ``adapters`` ("" : none; an empty column: no request names one)."""

    request_ids: Sequence[str] = ()
    models: Sequence[str] = ()
    tokens: Sequence[int] = ()
    kv_bytes: Sequence[int] = ()
    phases: Sequence[str] = ()
    adapters: Sequence[str] = ()

    def adapter_column(self) -> Sequence[str]:
        """The adapter of each request, in ``rows()``'s order ("" : its model itself)."""
        return self.adapters or [""] * len(self.request_ids)

    def __len__(self) -> int:
        return len(self.request_ids)

    def rows(self) -> Iterator[tuple[str, str, int, int, str]]:
        """(request_id, model, tokens, kv_bytes, phase) per request."""
        return zip(self.request_ids, self.models, self.tokens, self.kv_bytes, self.phases, strict=True)


@dataclass(frozen=True)
class PrefixCacheLoad:
    """The engine's prefix cache, compactly (for cache-aware dispatch): the KV blocks it caches (held by
    requests or idle) and the idle ones among them, and the prompt tokens looked up and found cached
    since the engine started: counts, not which blocks (the dispatcher's index is its own)."""

    blocks: int = 0
    idle_blocks: int = 0
    queries: int = 0
    hits: int = 0


@dataclass(frozen=True)
class LoadSnapshot:
    """Engine load at ``timestamp`` (seconds since the epoch)."""

    timestamp: float
    running: int
    waiting: int
    kv_used_bytes: int
    kv_capacity_bytes: int
    tokens_per_s: float
    models: tuple[ModelLoad, ...]
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    preemptions: int = 0
    kv_fragmentation: float = 0.0
    requests: RequestLoads = RequestLoads()
    max_running: int = 0  # the most requests one batch runs (0: unknown)
    prefix_cache: PrefixCacheLoad | None = None  # None: no prefix caching


@dataclass(frozen=True)
class LoadResult:
    model: LoadedModel
    already_loaded: bool


@dataclass
class ReconcileResult:
    loaded: list[str] = field(default_factory=list)
    unloaded: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
