from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
    FINISH_REASON_MIGRATED: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_ERROR: FinishReason
FINISH_REASON_MIGRATED: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "seed", "stop")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "queue_s", "ttft_s", "latency_s", "engine_ttft_s", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    ENGINE_TTFT_S_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    queue_s: float
    ttft_s: float
    latency_s: float
    engine_ttft_s: float
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., queue_s: _Optional[float] = ..., ttft_s: _Optional[float] = ..., latency_s: _Optional[float] = ..., engine_ttft_s: _Optional[float] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("request_id", "index", "token_ids", "text", "finish_reason", "usage", "engine_id", "migrated_to")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    MIGRATED_TO_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    finish_reason: FinishReason
    usage: Usage
    engine_id: str
    migrated_to: str
    def __init__(self, request_id: _Optional[str] = ..., index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., engine_id: _Optional[str] = ..., migrated_to: _Optional[str] = ...) -> None: ...

class ModelLoad(_message.Message):
    __slots__ = ("model", "running", "waiting", "kv_used_bytes", "kv_tokens", "kv_blocks", "tokens_per_block", "adapters", "adapter_loads", "adapter_slots")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_LOADS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_SLOTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    running: int
    waiting: int
    kv_used_bytes: int
    kv_tokens: int
    kv_blocks: int
    tokens_per_block: int
    adapters: _containers.RepeatedScalarFieldContainer[str]
    adapter_loads: int
    adapter_slots: int
    def __init__(self, model: _Optional[str] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_used_bytes: _Optional[int] = ..., kv_tokens: _Optional[int] = ..., kv_blocks: _Optional[int] = ..., tokens_per_block: _Optional[int] = ..., adapters: _Optional[_Iterable[str]] = ..., adapter_loads: _Optional[int] = ..., adapter_slots: _Optional[int] = ...) -> None: ...

class RequestLoad(_message.Message):
    __slots__ = ("request_id", "model", "tokens", "kv_bytes", "phase", "adapter")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    tokens: int
    kv_bytes: int
    phase: str
    adapter: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., tokens: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., phase: _Optional[str] = ..., adapter: _Optional[str] = ...) -> None: ...

class LoadSnapshot(_message.Message):
    __slots__ = ("engine_id", "timestamp", "running", "waiting", "kv_used_bytes", "kv_capacity_bytes", "tokens_per_s", "models", "kv_blocks_used", "kv_blocks_total", "preemptions", "kv_fragmentation", "requests", "max_running", "prefix_cache")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    KV_FRAGMENTATION_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    timestamp: float
    running: int
    waiting: int
    kv_used_bytes: int
    kv_capacity_bytes: int
    tokens_per_s: float
    models: _containers.RepeatedCompositeFieldContainer[ModelLoad]
    kv_blocks_used: int
    kv_blocks_total: int
    preemptions: int
    kv_fragmentation: float
    requests: _containers.RepeatedCompositeFieldContainer[RequestLoad]
    max_running: int
    prefix_cache: PrefixCacheLoad
    def __init__(self, engine_id: _Optional[str] = ..., timestamp: _Optional[float] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_used_bytes: _Optional[int] = ..., kv_capacity_bytes: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., models: _Optional[_Iterable[_Union[ModelLoad, _Mapping]]] = ..., kv_blocks_used: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., preemptions: _Optional[int] = ..., kv_fragmentation: _Optional[float] = ..., requests: _Optional[_Iterable[_Union[RequestLoad, _Mapping]]] = ..., max_running: _Optional[int] = ..., prefix_cache: _Optional[_Union[PrefixCacheLoad, _Mapping]] = ...) -> None: ...

class PrefixCacheLoad(_message.Message):
    __slots__ = ("blocks", "idle_blocks", "queries", "hits")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    IDLE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    blocks: int
    idle_blocks: int
    queries: int
    hits: int
    def __init__(self, blocks: _Optional[int] = ..., idle_blocks: _Optional[int] = ..., queries: _Optional[int] = ..., hits: _Optional[int] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class StreamEnd(_message.Message):
    __slots__ = ("request_id", "code", "details", "retry_after_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    code: int
    details: str
    retry_after_s: float
    def __init__(self, request_id: _Optional[str] = ..., code: _Optional[int] = ..., details: _Optional[str] = ..., retry_after_s: _Optional[float] = ...) -> None: ...

class ChunkBatch(_message.Message):
    __slots__ = ("chunks", "errors")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[TokenChunk]
    errors: _containers.RepeatedCompositeFieldContainer[StreamEnd]
    def __init__(self, chunks: _Optional[_Iterable[_Union[TokenChunk, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[StreamEnd, _Mapping]]] = ...) -> None: ...
