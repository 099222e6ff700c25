"""OpenTelemetry setup: a TracerProvider per process, OTLP export when configured, gRPC interceptors.

Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (spans go to that collector over OTLP/gRPC)
or when a caller passes its own exporter (tests use the in-memory exporter). The gRPC server and
client interceptors propagate W3C trace context in unary calls' metadata, and each stream of a
multiplexed call carries its own (``llmfleet.telemetry.streams``), so SDK -> scheduler -> engine
spans share one trace id.
"""

from __future__ import annotations

import logging
import os

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

log = logging.getLogger(__name__)
_configured = False


def setup_tracing(service_name: str, exporter: SpanExporter | None = None) -> TracerProvider | None:
    """Install a global TracerProvider for this process; returns None when tracing is off.

    With ``exporter`` given, spans are exported synchronously to it (tests). Otherwise an OTLP
    exporter is used iff ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set. Calling twice is harmless.
    """
    global _configured
    current = trace.get_tracer_provider()
    if _configured and isinstance(current, TracerProvider):
        if exporter is not None:
            current.add_span_processor(SimpleSpanProcessor(exporter))
        return current
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if exporter is None and not endpoint:
        return None
    provider = TracerProvider(
        resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    )
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        log.info("tracing: exporting spans for %s to %s", service_name, endpoint)
    trace.set_tracer_provider(provider)
    _configured = True
    return provider


def reset_tracing() -> None:
    """Uninstall the global TracerProvider (tests: one test's tracing must not make later tests
    record spans)."""
    global _configured
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER = None
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    _configured = False


def tracing_enabled() -> bool:
    return isinstance(trace.get_tracer_provider(), TracerProvider)


def server_interceptors() -> list:
    """Interceptors for grpc.aio servers (empty when tracing is off)."""
    if not tracing_enabled():
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor()]


def client_interceptors() -> list:
    """Interceptors for grpc.aio channels (empty when tracing is off)."""
    if not tracing_enabled():
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors())


def tracer(name: str = "llmfleet") -> trace.Tracer:
    return trace.get_tracer(name)
