"""llmfleet engine node: model loading, a continuous torch executor and the Engine gRPC servicer.

Typical wiring (see ``servicer.EngineServicer`` and ``executor.Executor``)::

    executor = Executor(ExecutorConfig(device="cpu", cache_dir=".llmfleet/models", num_threads=2))
    servicer = EngineServicer(executor, engine_id="engine-0")
    server = GrpcServer([(add_EngineServicer_to_server, servicer, service_name(engine_pb2, "Engine"))])
"""

from llmfleet_engine.backend import EngineBackend
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.models import LoadedModel, ModelLoadError, ModelSourceNotFound, load_model, materialize
from llmfleet_engine.outputs import EngineChunk, EngineUsage, FinishReason, LoadSnapshot, ModelLoad
from llmfleet_engine.servicer import EngineServicer
from llmfleet_engine.stream import RequestStream
from llmfleet_engine.validation import GenerationRequest, UnknownModelError, ValidationError, build_request

__all__ = [
    "EngineBackend",
    "EngineChunk",
    "EngineServicer",
    "EngineUsage",
    "Executor",
    "ExecutorConfig",
    "FinishReason",
    "GenerationRequest",
    "LoadSnapshot",
    "LoadedModel",
    "ModelLoad",
    "ModelLoadError",
    "ModelSourceNotFound",
    "RequestStream",
    "UnknownModelError",
    "ValidationError",
    "build_request",
    "load_model",
    "materialize",
]
