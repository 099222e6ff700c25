"""API keys on gRPC: ``authorization: Bearer <key>`` metadata, checked by a server interceptor and
attached by a client interceptor. Health checks and reflection stay open."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from llmfleet.security.api_keys import ApiKey, ApiKeyStore, bearer

OPEN_METHOD_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
MISSING = "missing API key: send the metadata 'authorization: Bearer <key>'"
INVALID = "invalid API key"


def _metadata_value(metadata: Any, name: str) -> str | None:
    for k, v in metadata or ():
        if k == name:
            return v.decode() if isinstance(v, bytes) else v
    return None


def caller_key(store: ApiKeyStore | None, context: grpc.aio.ServicerContext) -> ApiKey | None:
    """The key the caller authenticated with (None when keys are off); the interceptor has already
    refused calls without a valid one."""
    if store is None:
        return None
    return store.authenticate(bearer(_metadata_value(context.invocation_metadata(), "authorization")))


def _denied(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def abort(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def abort_stream(_request: Any, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator

    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort_stream, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort_stream, **kw)
    return grpc.unary_unary_rpc_method_handler(abort, **kw)


class ApiKeyServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, store: ApiKeyStore) -> None:
        self.store = store

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        token = bearer(_metadata_value(details.invocation_metadata, "authorization"))
        if token is None:
            return _denied(handler, MISSING)
        if self.store.authenticate(token) is None:
            return _denied(handler, INVALID)
        return handler


def _with_key(details: grpc.aio.ClientCallDetails, header: tuple[str, str]) -> grpc.aio.ClientCallDetails:
    metadata = list(details.metadata or ())
    metadata.append(header)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, grpc.aio.Metadata(*metadata), details.credentials,
        details.wait_for_ready,
    )  # fmt: skip


class _Bearer:
    def __init__(self, key: str) -> None:
        self.header = ("authorization", f"Bearer {key}")


class _UU(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(_with_key(details, self.header), request)


class _US(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(_with_key(details, self.header), request)


class _SU(_Bearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(_with_key(details, self.header), request_iterator)


class _SS(_Bearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(_with_key(details, self.header), request_iterator)


def bearer_interceptors(key: str) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors sending ``key`` on every call of a channel."""
    return [cls(key) for cls in (_UU, _US, _SU, _SS)]
