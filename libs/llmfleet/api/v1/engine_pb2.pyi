from llmfleet.api.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "model", "prompt", "sampling", "resume_token_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    prompt: str
    sampling: _common_pb2.SamplingParams
    resume_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., resume_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

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
    __slots__ = ("name", "source", "architecture", "weight_bytes", "max_context", "kv_bytes_per_token")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    architecture: str
    weight_bytes: int
    max_context: int
    kv_bytes_per_token: int
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ..., architecture: _Optional[str] = ..., weight_bytes: _Optional[int] = ..., max_context: _Optional[int] = ..., kv_bytes_per_token: _Optional[int] = ...) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("engine_id", "device", "backend", "memory_bytes", "kv_capacity_bytes", "models")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    device: str
    backend: str
    memory_bytes: int
    kv_capacity_bytes: int
    models: _containers.RepeatedCompositeFieldContainer[LoadedModel]
    def __init__(self, engine_id: _Optional[str] = ..., device: _Optional[str] = ..., backend: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., kv_capacity_bytes: _Optional[int] = ..., models: _Optional[_Iterable[_Union[LoadedModel, _Mapping]]] = ...) -> None: ...

class WatchLoadRequest(_message.Message):
    __slots__ = ("interval_s",)
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    def __init__(self, interval_s: _Optional[float] = ...) -> None: ...
