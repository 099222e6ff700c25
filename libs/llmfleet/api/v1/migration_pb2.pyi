from llmfleet.api.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineKvStatus(_message.Message):
    __slots__ = ("engine_id", "address", "reporting", "age_s", "load")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REPORTING_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    address: str
    reporting: bool
    age_s: float
    load: _common_pb2.LoadSnapshot
    def __init__(self, engine_id: _Optional[str] = ..., address: _Optional[str] = ..., reporting: _Optional[bool] = ..., age_s: _Optional[float] = ..., load: _Optional[_Union[_common_pb2.LoadSnapshot, _Mapping]] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("leader_id", "is_leader", "engines")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    leader_id: str
    is_leader: bool
    engines: _containers.RepeatedCompositeFieldContainer[EngineKvStatus]
    def __init__(self, leader_id: _Optional[str] = ..., is_leader: _Optional[bool] = ..., engines: _Optional[_Iterable[_Union[EngineKvStatus, _Mapping]]] = ...) -> None: ...
