from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PredictItem(_message.Message):
    __slots__ = ("request_id", "service", "prompt", "prompt_tokens", "generated_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    service: str
    prompt: str
    prompt_tokens: int
    generated_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., service: _Optional[str] = ..., prompt: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PredictItem]
    def __init__(self, items: _Optional[_Iterable[_Union[PredictItem, _Mapping]]] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("request_id", "mean_output_tokens", "std_output_tokens", "observations", "predictor", "quantiles", "bucket_probs", "bucket_edges")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MEAN_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STD_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_FIELD_NUMBER: _ClassVar[int]
    QUANTILES_FIELD_NUMBER: _ClassVar[int]
    BUCKET_PROBS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_EDGES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    mean_output_tokens: float
    std_output_tokens: float
    observations: int
    predictor: str
    quantiles: _containers.RepeatedScalarFieldContainer[float]
    bucket_probs: _containers.RepeatedScalarFieldContainer[float]
    bucket_edges: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., mean_output_tokens: _Optional[float] = ..., std_output_tokens: _Optional[float] = ..., observations: _Optional[int] = ..., predictor: _Optional[str] = ..., quantiles: _Optional[_Iterable[float]] = ..., bucket_probs: _Optional[_Iterable[float]] = ..., bucket_edges: _Optional[_Iterable[int]] = ...) -> None: ...

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

class CharacterizeRequest(_message.Message):
    __slots__ = ("model", "engine_id", "hardware", "batch_sizes", "input_lengths", "context_lengths", "repeats")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    INPUT_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    model: str
    engine_id: str
    hardware: str
    batch_sizes: _containers.RepeatedScalarFieldContainer[int]
    input_lengths: _containers.RepeatedScalarFieldContainer[int]
    context_lengths: _containers.RepeatedScalarFieldContainer[int]
    repeats: int
    def __init__(self, model: _Optional[str] = ..., engine_id: _Optional[str] = ..., hardware: _Optional[str] = ..., batch_sizes: _Optional[_Iterable[int]] = ..., input_lengths: _Optional[_Iterable[int]] = ..., context_lengths: _Optional[_Iterable[int]] = ..., repeats: _Optional[int] = ...) -> None: ...

class GetProfileRequest(_message.Message):
    __slots__ = ("model", "hardware")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    model: str
    hardware: str
    def __init__(self, model: _Optional[str] = ..., hardware: _Optional[str] = ...) -> None: ...

class FitQuality(_message.Message):
    __slots__ = ("name", "rmse_s", "max_rel_error", "points")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RMSE_S_FIELD_NUMBER: _ClassVar[int]
    MAX_REL_ERROR_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    rmse_s: float
    max_rel_error: float
    points: int
    def __init__(self, name: _Optional[str] = ..., rmse_s: _Optional[float] = ..., max_rel_error: _Optional[float] = ..., points: _Optional[int] = ...) -> None: ...

class CostProfile(_message.Message):
    __slots__ = ("model", "hardware", "engine", "source", "date", "coefficients_json", "fits", "samples")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DATE_FIELD_NUMBER: _ClassVar[int]
    COEFFICIENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    model: str
    hardware: str
    engine: str
    source: str
    date: str
    coefficients_json: str
    fits: _containers.RepeatedCompositeFieldContainer[FitQuality]
    samples: int
    def __init__(self, model: _Optional[str] = ..., hardware: _Optional[str] = ..., engine: _Optional[str] = ..., source: _Optional[str] = ..., date: _Optional[str] = ..., coefficients_json: _Optional[str] = ..., fits: _Optional[_Iterable[_Union[FitQuality, _Mapping]]] = ..., samples: _Optional[int] = ...) -> None: ...
