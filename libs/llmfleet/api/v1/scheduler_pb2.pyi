from llmfleet.api.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitRequest(_message.Message):
    __slots__ = ("request_id", "service", "prompt", "sampling", "resume_token_ids", "session", "priority")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    service: str
    prompt: str
    sampling: _common_pb2.SamplingParams
    resume_token_ids: _containers.RepeatedScalarFieldContainer[int]
    session: str
    priority: int
    def __init__(self, request_id: _Optional[str] = ..., service: _Optional[str] = ..., prompt: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., resume_token_ids: _Optional[_Iterable[int]] = ..., session: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class SubmitStart(_message.Message):
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
    request: SubmitRequest
    timeout_s: float
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, request: _Optional[_Union[SubmitRequest, _Mapping]] = ..., timeout_s: _Optional[float] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SubmitCommands(_message.Message):
    __slots__ = ("start", "cancel")
    START_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    start: _containers.RepeatedCompositeFieldContainer[SubmitStart]
    cancel: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, start: _Optional[_Iterable[_Union[SubmitStart, _Mapping]]] = ..., cancel: _Optional[_Iterable[str]] = ...) -> None: ...

class ServiceInfo(_message.Message):
    __slots__ = ("name", "model", "ttft_slo_s", "tpot_slo_s", "priority", "engines")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TTFT_SLO_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_SLO_S_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    ttft_slo_s: float
    tpot_slo_s: float
    priority: int
    engines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., ttft_slo_s: _Optional[float] = ..., tpot_slo_s: _Optional[float] = ..., priority: _Optional[int] = ..., engines: _Optional[_Iterable[str]] = ...) -> None: ...

class ListServicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListServicesResponse(_message.Message):
    __slots__ = ("services",)
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    services: _containers.RepeatedCompositeFieldContainer[ServiceInfo]
    def __init__(self, services: _Optional[_Iterable[_Union[ServiceInfo, _Mapping]]] = ...) -> None: ...
