"""Status details bounded in size on every server.

A refusal that echoes a request field (``unknown model '<1 MiB string>'``) would put megabytes into
the ``grpc-message`` trailer, past gRPC's 16 KiB metadata limit: the client then sees RESOURCE_EXHAUSTED
"received metadata size exceeds hard limit" instead of the refusal (found by fuzzing). The interceptor
hands every handler a context whose ``abort`` / ``set_details`` clip the details to ``MAX_DETAILS``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import grpc

MAX_DETAILS = 4096  # characters; the grpc-message trailer is percent-encoded (up to 3 bytes per byte)


def clip(details: str) -> str:
    if len(details) <= MAX_DETAILS:
        return details
    return f"{details[: MAX_DETAILS - 64]}... (clipped; {len(details)} characters)"


class _Context:
    """A servicer context whose status details are clipped; everything else is the real context."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        await self._context.abort(code, clip(details or ""), trailing_metadata)

    def set_details(self, details: str) -> None:
        self._context.set_details(clip(details))


def _wrap(behavior: Callable, streaming_response: bool) -> Callable:
    if streaming_response and inspect.isasyncgenfunction(behavior):

        async def stream(request, context):
            async for item in behavior(request, _Context(context)):
                yield item

        return stream
    if inspect.iscoroutinefunction(behavior):

        async def call(request, context):
            return await behavior(request, _Context(context))

        return call
    return behavior  # a sync behavior: left as it is


class ClipDetailsInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        h = await continuation(details)
        if h is None:
            return None
        kw = {"request_deserializer": h.request_deserializer, "response_serializer": h.response_serializer}
        if h.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(_wrap(h.unary_unary, False), **kw)
        if h.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(_wrap(h.unary_stream, True), **kw)
        if h.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(_wrap(h.stream_unary, False), **kw)
        if h.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(_wrap(h.stream_stream, True), **kw)
        return h
