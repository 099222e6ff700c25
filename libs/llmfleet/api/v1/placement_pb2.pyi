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

class PoolEngine(_message.Message):
    __slots__ = ("engine_id", "address", "hardware", "device", "memory_bytes", "tp", "models", "desired", "idle")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    address: str
    hardware: str
    device: str
    memory_bytes: int
    tp: int
    models: _containers.RepeatedScalarFieldContainer[str]
    desired: _containers.RepeatedScalarFieldContainer[str]
    idle: bool
    def __init__(self, engine_id: _Optional[str] = ..., address: _Optional[str] = ..., hardware: _Optional[str] = ..., device: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., tp: _Optional[int] = ..., models: _Optional[_Iterable[str]] = ..., desired: _Optional[_Iterable[str]] = ..., idle: _Optional[bool] = ...) -> None: ...

class PlacementDecision(_message.Message):
    __slots__ = ("time", "policy", "summary", "reason", "ok", "error")
    TIME_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    time: float
    policy: str
    summary: str
    reason: str
    ok: bool
    error: str
    def __init__(self, time: _Optional[float] = ..., policy: _Optional[str] = ..., summary: _Optional[str] = ..., reason: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class PlacementPlan(_message.Message):
    __slots__ = ("leader_id", "is_leader", "engines", "revision", "pool", "gpus_in_use", "gpus_total", "decisions", "services")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    GPUS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    leader_id: str
    is_leader: bool
    engines: _containers.RepeatedCompositeFieldContainer[EnginePlacement]
    revision: int
    pool: _containers.RepeatedCompositeFieldContainer[PoolEngine]
    gpus_in_use: int
    gpus_total: int
    decisions: _containers.RepeatedCompositeFieldContainer[PlacementDecision]
    services: _containers.RepeatedCompositeFieldContainer[ServiceStats]
    def __init__(self, leader_id: _Optional[str] = ..., is_leader: _Optional[bool] = ..., engines: _Optional[_Iterable[_Union[EnginePlacement, _Mapping]]] = ..., revision: _Optional[int] = ..., pool: _Optional[_Iterable[_Union[PoolEngine, _Mapping]]] = ..., gpus_in_use: _Optional[int] = ..., gpus_total: _Optional[int] = ..., decisions: _Optional[_Iterable[_Union[PlacementDecision, _Mapping]]] = ..., services: _Optional[_Iterable[_Union[ServiceStats, _Mapping]]] = ...) -> None: ...

class LengthSummary(_message.Message):
    __slots__ = ("count", "mean", "m2")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    M2_FIELD_NUMBER: _ClassVar[int]
    count: int
    mean: float
    m2: float
    def __init__(self, count: _Optional[int] = ..., mean: _Optional[float] = ..., m2: _Optional[float] = ...) -> None: ...

class Distribution(_message.Message):
    __slots__ = ("count", "mean", "p50", "p90", "p99")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    P50_FIELD_NUMBER: _ClassVar[int]
    P90_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    def __init__(self, count: _Optional[int] = ..., mean: _Optional[float] = ..., p50: _Optional[float] = ..., p90: _Optional[float] = ..., p99: _Optional[float] = ...) -> None: ...

class WindowStats(_message.Message):
    __slots__ = ("window_s", "span_s", "arrivals", "rate_rps", "completed", "failed", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "latency_s", "slo_met", "latency_met", "ttft_tpot_met", "normalized_sum", "normalized_count")
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    SPAN_S_FIELD_NUMBER: _ClassVar[int]
    ARRIVALS_FIELD_NUMBER: _ClassVar[int]
    RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_S_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    SLO_MET_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MET_FIELD_NUMBER: _ClassVar[int]
    TTFT_TPOT_MET_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_SUM_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_COUNT_FIELD_NUMBER: _ClassVar[int]
    window_s: float
    span_s: float
    arrivals: int
    rate_rps: float
    completed: int
    failed: int
    prompt_tokens: LengthSummary
    output_tokens: LengthSummary
    ttft_s: Distribution
    tpot_s: Distribution
    latency_s: Distribution
    slo_met: int
    latency_met: int
    ttft_tpot_met: int
    normalized_sum: float
    normalized_count: int
    def __init__(self, window_s: _Optional[float] = ..., span_s: _Optional[float] = ..., arrivals: _Optional[int] = ..., rate_rps: _Optional[float] = ..., completed: _Optional[int] = ..., failed: _Optional[int] = ..., prompt_tokens: _Optional[_Union[LengthSummary, _Mapping]] = ..., output_tokens: _Optional[_Union[LengthSummary, _Mapping]] = ..., ttft_s: _Optional[_Union[Distribution, _Mapping]] = ..., tpot_s: _Optional[_Union[Distribution, _Mapping]] = ..., latency_s: _Optional[_Union[Distribution, _Mapping]] = ..., slo_met: _Optional[int] = ..., latency_met: _Optional[int] = ..., ttft_tpot_met: _Optional[int] = ..., normalized_sum: _Optional[float] = ..., normalized_count: _Optional[int] = ...) -> None: ...

class RequestSample(_message.Message):
    __slots__ = ("age_s", "prompt_tokens", "output_tokens")
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    age_s: float
    prompt_tokens: int
    output_tokens: int
    def __init__(self, age_s: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class ServiceStats(_message.Message):
    __slots__ = ("service", "model", "windows", "samples", "samples_complete", "infeasible", "queued", "cold", "held")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    INFEASIBLE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    COLD_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    service: str
    model: str
    windows: _containers.RepeatedCompositeFieldContainer[WindowStats]
    samples: _containers.RepeatedCompositeFieldContainer[RequestSample]
    samples_complete: bool
    infeasible: int
    queued: int
    cold: int
    held: int
    def __init__(self, service: _Optional[str] = ..., model: _Optional[str] = ..., windows: _Optional[_Iterable[_Union[WindowStats, _Mapping]]] = ..., samples: _Optional[_Iterable[_Union[RequestSample, _Mapping]]] = ..., samples_complete: _Optional[bool] = ..., infeasible: _Optional[int] = ..., queued: _Optional[int] = ..., cold: _Optional[int] = ..., held: _Optional[int] = ...) -> None: ...

class ServiceStatsReport(_message.Message):
    __slots__ = ("scheduler_id", "seq", "interval_s", "services")
    SCHEDULER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    scheduler_id: str
    seq: int
    interval_s: float
    services: _containers.RepeatedCompositeFieldContainer[ServiceStats]
    def __init__(self, scheduler_id: _Optional[str] = ..., seq: _Optional[int] = ..., interval_s: _Optional[float] = ..., services: _Optional[_Iterable[_Union[ServiceStats, _Mapping]]] = ...) -> None: ...

class ReportStatsAck(_message.Message):
    __slots__ = ("seq", "accepted", "error", "is_leader", "leader_id")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    seq: int
    accepted: bool
    error: str
    is_leader: bool
    leader_id: str
    def __init__(self, seq: _Optional[int] = ..., accepted: _Optional[bool] = ..., error: _Optional[str] = ..., is_leader: _Optional[bool] = ..., leader_id: _Optional[str] = ...) -> None: ...
