from llmfleet.api.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MigrateMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MIGRATE_MODE_KV: _ClassVar[MigrateMode]
    MIGRATE_MODE_TOKENS: _ClassVar[MigrateMode]
MIGRATE_MODE_KV: MigrateMode
MIGRATE_MODE_TOKENS: MigrateMode

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "model", "prompt", "sampling", "resume_token_ids", "service", "predicted_output_tokens", "deadline_s", "batch_id", "batch_size", "priority", "tenant")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    prompt: str
    sampling: _common_pb2.SamplingParams
    resume_token_ids: _containers.RepeatedScalarFieldContainer[int]
    service: str
    predicted_output_tokens: float
    deadline_s: float
    batch_id: str
    batch_size: int
    priority: int
    tenant: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., resume_token_ids: _Optional[_Iterable[int]] = ..., service: _Optional[str] = ..., predicted_output_tokens: _Optional[float] = ..., deadline_s: _Optional[float] = ..., batch_id: _Optional[str] = ..., batch_size: _Optional[int] = ..., priority: _Optional[int] = ..., tenant: _Optional[str] = ...) -> None: ...

class GenerateStart(_message.Message):
    __slots__ = ("request", "timeout_s", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    request: GenerateRequest
    timeout_s: float
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, request: _Optional[_Union[GenerateRequest, _Mapping]] = ..., timeout_s: _Optional[float] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GenerateCommands(_message.Message):
    __slots__ = ("start", "cancel")
    START_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    start: _containers.RepeatedCompositeFieldContainer[GenerateStart]
    cancel: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, start: _Optional[_Iterable[_Union[GenerateStart, _Mapping]]] = ..., cancel: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("name", "source", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    dtype: str
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ..., dtype: _Optional[str] = ...) -> None: ...

class LoadModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: ModelSpec
    def __init__(self, model: _Optional[_Union[ModelSpec, _Mapping]] = ...) -> None: ...

class LoadModelResponse(_message.Message):
    __slots__ = ("model", "weight_bytes", "max_context", "load_s")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    LOAD_S_FIELD_NUMBER: _ClassVar[int]
    model: str
    weight_bytes: int
    max_context: int
    load_s: float
    def __init__(self, model: _Optional[str] = ..., weight_bytes: _Optional[int] = ..., max_context: _Optional[int] = ..., load_s: _Optional[float] = ...) -> None: ...

class UnloadModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class UnloadModelResponse(_message.Message):
    __slots__ = ("unloaded",)
    UNLOADED_FIELD_NUMBER: _ClassVar[int]
    unloaded: bool
    def __init__(self, unloaded: _Optional[bool] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadedModel(_message.Message):
    __slots__ = ("name", "source", "architecture", "weight_bytes", "max_context", "kv_bytes_per_token", "tokens_per_block", "reserved_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    architecture: str
    weight_bytes: int
    max_context: int
    kv_bytes_per_token: int
    tokens_per_block: int
    reserved_bytes: int
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ..., architecture: _Optional[str] = ..., weight_bytes: _Optional[int] = ..., max_context: _Optional[int] = ..., kv_bytes_per_token: _Optional[int] = ..., tokens_per_block: _Optional[int] = ..., reserved_bytes: _Optional[int] = ...) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("engine_id", "device", "backend", "memory_bytes", "kv_capacity_bytes", "models", "kv_block_bytes", "kv_num_blocks", "policy", "memory_budget_bytes", "links", "max_migrations")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    MAX_MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    device: str
    backend: str
    memory_bytes: int
    kv_capacity_bytes: int
    models: _containers.RepeatedCompositeFieldContainer[LoadedModel]
    kv_block_bytes: int
    kv_num_blocks: int
    policy: str
    memory_budget_bytes: int
    links: _containers.RepeatedCompositeFieldContainer[LinkEstimate]
    max_migrations: int
    def __init__(self, engine_id: _Optional[str] = ..., device: _Optional[str] = ..., backend: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., kv_capacity_bytes: _Optional[int] = ..., models: _Optional[_Iterable[_Union[LoadedModel, _Mapping]]] = ..., kv_block_bytes: _Optional[int] = ..., kv_num_blocks: _Optional[int] = ..., policy: _Optional[str] = ..., memory_budget_bytes: _Optional[int] = ..., links: _Optional[_Iterable[_Union[LinkEstimate, _Mapping]]] = ..., max_migrations: _Optional[int] = ...) -> None: ...

class LinkEstimate(_message.Message):
    __slots__ = ("destination", "bytes_per_s", "bytes", "seconds", "source", "timestamp")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    destination: str
    bytes_per_s: float
    bytes: int
    seconds: float
    source: str
    timestamp: float
    def __init__(self, destination: _Optional[str] = ..., bytes_per_s: _Optional[float] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., source: _Optional[str] = ..., timestamp: _Optional[float] = ...) -> None: ...

class WatchLoadRequest(_message.Message):
    __slots__ = ("interval_s",)
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    def __init__(self, interval_s: _Optional[float] = ...) -> None: ...

class KvShape(_message.Message):
    __slots__ = ("num_layers", "num_kv_heads", "head_dim", "dtype")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    def __init__(self, num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., dtype: _Optional[str] = ...) -> None: ...

class KvTransferHeader(_message.Message):
    __slots__ = ("request_id", "model", "shape", "num_tokens", "prompt_token_ids", "generated_token_ids", "sampling", "service", "rng_state", "age_s", "source_engine_id", "prompt", "adapter")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    shape: KvShape
    num_tokens: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    generated_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    service: str
    rng_state: bytes
    age_s: float
    source_engine_id: str
    prompt: str
    adapter: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., shape: _Optional[_Union[KvShape, _Mapping]] = ..., num_tokens: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., generated_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., service: _Optional[str] = ..., rng_state: _Optional[bytes] = ..., age_s: _Optional[float] = ..., source_engine_id: _Optional[str] = ..., prompt: _Optional[str] = ..., adapter: _Optional[str] = ...) -> None: ...

class KvData(_message.Message):
    __slots__ = ("start_token", "num_tokens", "data")
    START_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    start_token: int
    num_tokens: int
    data: bytes
    def __init__(self, start_token: _Optional[int] = ..., num_tokens: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class KvChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: KvTransferHeader
    data: KvData
    def __init__(self, header: _Optional[_Union[KvTransferHeader, _Mapping]] = ..., data: _Optional[_Union[KvData, _Mapping]] = ...) -> None: ...

class ExportKvRequest(_message.Message):
    __slots__ = ("request_id", "chunk_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    chunk_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., chunk_tokens: _Optional[int] = ...) -> None: ...

class ImportKvResponse(_message.Message):
    __slots__ = ("request_id", "num_tokens", "blocks", "bytes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_tokens: int
    blocks: int
    bytes: int
    def __init__(self, request_id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., blocks: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class MigrateRequest(_message.Message):
    __slots__ = ("request_id", "destination", "chunk_tokens", "mode", "migration_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    destination: str
    chunk_tokens: int
    mode: MigrateMode
    migration_id: str
    def __init__(self, request_id: _Optional[str] = ..., destination: _Optional[str] = ..., chunk_tokens: _Optional[int] = ..., mode: _Optional[_Union[MigrateMode, str]] = ..., migration_id: _Optional[str] = ...) -> None: ...

class MigrateResponse(_message.Message):
    __slots__ = ("request_id", "num_tokens", "bytes", "transfer_s", "pause_s", "mode", "migration_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    PAUSE_S_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_tokens: int
    bytes: int
    transfer_s: float
    pause_s: float
    mode: MigrateMode
    migration_id: str
    def __init__(self, request_id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., bytes: _Optional[int] = ..., transfer_s: _Optional[float] = ..., pause_s: _Optional[float] = ..., mode: _Optional[_Union[MigrateMode, str]] = ..., migration_id: _Optional[str] = ...) -> None: ...

class MeasureLinkRequest(_message.Message):
    __slots__ = ("destination", "bytes")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    destination: str
    bytes: int
    def __init__(self, destination: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class MeasureLinkResponse(_message.Message):
    __slots__ = ("destination", "bytes", "seconds", "bytes_per_s")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    destination: str
    bytes: int
    seconds: float
    bytes_per_s: float
    def __init__(self, destination: _Optional[str] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., bytes_per_s: _Optional[float] = ...) -> None: ...

class ProbeChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ProbeAck(_message.Message):
    __slots__ = ("bytes", "seconds")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    seconds: float
    def __init__(self, bytes: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class ProfileRequest(_message.Message):
    __slots__ = ("model", "batch_sizes", "input_lengths", "context_lengths", "repeats")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    INPUT_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    model: str
    batch_sizes: _containers.RepeatedScalarFieldContainer[int]
    input_lengths: _containers.RepeatedScalarFieldContainer[int]
    context_lengths: _containers.RepeatedScalarFieldContainer[int]
    repeats: int
    def __init__(self, model: _Optional[str] = ..., batch_sizes: _Optional[_Iterable[int]] = ..., input_lengths: _Optional[_Iterable[int]] = ..., context_lengths: _Optional[_Iterable[int]] = ..., repeats: _Optional[int] = ...) -> None: ...

class ProfileSample(_message.Message):
    __slots__ = ("phase", "batch_size", "tokens", "seconds")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    phase: str
    batch_size: int
    tokens: int
    seconds: float
    def __init__(self, phase: _Optional[str] = ..., batch_size: _Optional[int] = ..., tokens: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class ProfileResponse(_message.Message):
    __slots__ = ("model", "device", "samples")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    model: str
    device: str
    samples: _containers.RepeatedCompositeFieldContainer[ProfileSample]
    def __init__(self, model: _Optional[str] = ..., device: _Optional[str] = ..., samples: _Optional[_Iterable[_Union[ProfileSample, _Mapping]]] = ...) -> None: ...
