"""Spans of the streams on a multiplexed call: one client span and one server span per request, as a
call per request would have, in the request's own trace.

The caller starts the client span when it opens a stream (in the context of whatever span is current,
e.g. the scheduler's server span of that request) and sends the span's W3C trace context in the start
command (``trace_context``: ``traceparent``/``tracestate``). The server runs the stream's handler in a
server span whose parent is that context, so every call the handler makes joins the trace. The span
names are the multiplexed method's (``/llmfleet.v1.Engine/GenerateMany``), with the request id as
the ``llmfleet.request_id`` attribute. Nothing is started while tracing is off.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from llmfleet.telemetry import tracer, tracing_enabled

REQUEST_ID = "llmfleet.request_id"


def _attributes(method: str, request_id: str) -> dict[str, str]:
    service, _, name = method.strip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name, REQUEST_ID: request_id}


def client_span(method: str, request_id: str) -> tuple[Span | None, dict[str, str]]:
    """A client span for one stream of ``method`` (child of the current span) and its trace context
    to send along; (None, {}) while tracing is off."""
    if not tracing_enabled():
        return None, {}
    span = tracer().start_span(method, kind=SpanKind.CLIENT, attributes=_attributes(method, request_id))
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return span, carrier


def end_span(span: Span, error: BaseException | None) -> None:
    """End a stream's span; an error other than a cancel marks it failed."""
    if error is not None and not isinstance(error, asyncio.CancelledError):
        span.set_status(Status(StatusCode.ERROR, str(error)))
    span.end()


@contextlib.contextmanager
def server_span(method: str, request_id: str, carrier: Mapping[str, str]) -> Iterator[None]:
    """The server span of one stream, current while the body runs (its parent is the caller's span
    in ``carrier``); nothing when the caller sent no trace context or tracing is off here."""
    if not carrier or not tracing_enabled():
        yield
        return
    parent = propagate.extract(dict(carrier))
    with tracer().start_as_current_span(
        method, context=parent, kind=SpanKind.SERVER, attributes=_attributes(method, request_id)
    ):
        yield
