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
    __slots__ = ("engine_id", "address", "reporting", "age_s", "load", "active", "gpu_type")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REPORTING_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    address: str
    reporting: bool
    age_s: float
    load: _common_pb2.LoadSnapshot
    active: bool
    gpu_type: str
    def __init__(self, engine_id: _Optional[str] = ..., address: _Optional[str] = ..., reporting: _Optional[bool] = ..., age_s: _Optional[float] = ..., load: _Optional[_Union[_common_pb2.LoadSnapshot, _Mapping]] = ..., active: _Optional[bool] = ..., gpu_type: _Optional[str] = ...) -> None: ...

class MigrationRecord(_message.Message):
    __slots__ = ("migration_id", "request_id", "source", "destination", "mode", "kv_bytes", "state", "error", "seconds")
    MIGRATION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    migration_id: str
    request_id: str
    source: str
    destination: str
    mode: str
    kv_bytes: int
    state: str
    error: str
    seconds: float
    def __init__(self, migration_id: _Optional[str] = ..., request_id: _Optional[str] = ..., source: _Optional[str] = ..., destination: _Optional[str] = ..., mode: _Optional[str] = ..., kv_bytes: _Optional[int] = ..., state: _Optional[str] = ..., error: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class EpochRecord(_message.Message):
    __slots__ = ("epoch", "time", "operations", "planned", "executed", "failed", "deferred", "cancelled", "activated", "deactivated", "active_engines")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_FIELD_NUMBER: _ClassVar[int]
    EXECUTED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    ACTIVATED_FIELD_NUMBER: _ClassVar[int]
    DEACTIVATED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ENGINES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    time: float
    operations: int
    planned: int
    executed: int
    failed: int
    deferred: int
    cancelled: int
    activated: _containers.RepeatedScalarFieldContainer[str]
    deactivated: _containers.RepeatedScalarFieldContainer[str]
    active_engines: int
    def __init__(self, epoch: _Optional[int] = ..., time: _Optional[float] = ..., operations: _Optional[int] = ..., planned: _Optional[int] = ..., executed: _Optional[int] = ..., failed: _Optional[int] = ..., deferred: _Optional[int] = ..., cancelled: _Optional[int] = ..., activated: _Optional[_Iterable[str]] = ..., deactivated: _Optional[_Iterable[str]] = ..., active_engines: _Optional[int] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("leader_id", "is_leader", "engines", "policy", "epoch_s", "running", "recent", "epochs")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_S_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    leader_id: str
    is_leader: bool
    engines: _containers.RepeatedCompositeFieldContainer[EngineKvStatus]
    policy: str
    epoch_s: float
    running: _containers.RepeatedCompositeFieldContainer[MigrationRecord]
    recent: _containers.RepeatedCompositeFieldContainer[MigrationRecord]
    epochs: _containers.RepeatedCompositeFieldContainer[EpochRecord]
    def __init__(self, leader_id: _Optional[str] = ..., is_leader: _Optional[bool] = ..., engines: _Optional[_Iterable[_Union[EngineKvStatus, _Mapping]]] = ..., policy: _Optional[str] = ..., epoch_s: _Optional[float] = ..., running: _Optional[_Iterable[_Union[MigrationRecord, _Mapping]]] = ..., recent: _Optional[_Iterable[_Union[MigrationRecord, _Mapping]]] = ..., epochs: _Optional[_Iterable[_Union[EpochRecord, _Mapping]]] = ...) -> None: ...
