from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PredictItem(_message.Message):
    __slots__ = ("request_id", "service", "prompt", "prompt_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    service: str
    prompt: str
    prompt_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., service: _Optional[str] = ..., prompt: _Optional[str] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PredictItem]
    def __init__(self, items: _Optional[_Iterable[_Union[PredictItem, _Mapping]]] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("request_id", "mean_output_tokens", "std_output_tokens", "observations", "predictor")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MEAN_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STD_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    mean_output_tokens: float
    std_output_tokens: float
    observations: int
    predictor: str
    def __init__(self, request_id: _Optional[str] = ..., mean_output_tokens: _Optional[float] = ..., std_output_tokens: _Optional[float] = ..., observations: _Optional[int] = ..., predictor: _Optional[str] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("predictions",)
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    predictions: _containers.RepeatedCompositeFieldContainer[Prediction]
    def __init__(self, predictions: _Optional[_Iterable[_Union[Prediction, _Mapping]]] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("request_id", "service", "prompt_tokens", "output_tokens", "latency_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    service: str
    prompt_tokens: int
    output_tokens: int
    latency_s: float
    def __init__(self, request_id: _Optional[str] = ..., service: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., latency_s: _Optional[float] = ...) -> None: ...

class ObserveRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Observation]
    def __init__(self, items: _Optional[_Iterable[_Union[Observation, _Mapping]]] = ...) -> None: ...

class ObserveResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    def __init__(self, accepted: _Optional[int] = ...) -> None: ...
