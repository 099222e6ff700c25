from llmfleet.api.v1 import engine_pb2 as _engine_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnginePlacement(_message.Message):
    __slots__ = ("engine_id", "models", "loaded")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    models: _containers.RepeatedCompositeFieldContainer[_engine_pb2.ModelSpec]
    loaded: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, engine_id: _Optional[str] = ..., models: _Optional[_Iterable[_Union[_engine_pb2.ModelSpec, _Mapping]]] = ..., loaded: _Optional[_Iterable[str]] = ...) -> None: ...

class PlacementPlan(_message.Message):
    __slots__ = ("leader_id", "is_leader", "engines", "revision")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    leader_id: str
    is_leader: bool
    engines: _containers.RepeatedCompositeFieldContainer[EnginePlacement]
    revision: int
    def __init__(self, leader_id: _Optional[str] = ..., is_leader: _Optional[bool] = ..., engines: _Optional[_Iterable[_Union[EnginePlacement, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...
