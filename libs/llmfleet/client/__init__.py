"""The llmfleet SDK: ``AsyncClient`` (asyncio) and ``Client`` (blocking) for the scheduler.

    with Client("127.0.0.1:50051") as client:
        print(client.complete("Hello", service="chat", max_tokens=16).text)

Errors are typed (``llmfleet.client.errors``); ``llmfleet.client.testing`` has an in-process fake
Scheduler for testing code that uses the SDK.
"""

from llmfleet.client.aio import AsyncClient, GenerateStream, new_request_id
from llmfleet.client.errors import (
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    LlmfleetError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from llmfleet.client.sync import Client, GenerateIterator
from llmfleet.client.types import Chunk, Completion, ServiceInfo, Usage

__all__ = [
    "AlreadyExists",
    "AsyncClient",
    "Cancelled",
    "Chunk",
    "Client",
    "Completion",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GenerateIterator",
    "GenerateStream",
    "Internal",
    "InvalidArgument",
    "LlmfleetError",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "ServiceInfo",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "new_request_id",
]
