"""Client channels: TLS and API key from the process's security settings, tracing interceptors, and
keep-alive settings suitable for long streams."""

from __future__ import annotations

import grpc

from llmfleet.security import SecuritySettings, current
from llmfleet.security.grpc_auth import bearer_interceptors
from llmfleet.security.tls import channel_credentials
from llmfleet.telemetry import client_interceptors

CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # Fail fast on a dead peer rather than backing off for minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


def open_channel(
    address: str, security: SecuritySettings | None = None, tracing: bool = True
) -> grpc.aio.Channel:
    """A grpc.aio channel to ``host:port``: TLS and an API key as ``security`` (default: this process's
    settings) says, tracing when it is enabled. ``tracing=False`` for calls driven with ``write()`` and
    ``initial_metadata()`` (the KV transfer's handshake): OpenTelemetry's stream-unary interceptor
    awaits the whole call before handing it over, so the handshake would wait forever."""
    s = security or current()
    interceptors = client_interceptors() if tracing else []
    if s.api_key:
        interceptors = [*interceptors, *bearer_interceptors(s.api_key)]
    creds = channel_credentials(s)
    if creds is None:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=interceptors or None)
    return grpc.aio.secure_channel(address, creds, options=CHANNEL_OPTIONS, interceptors=interceptors or None)


def open_sync_channel(address: str, security: SecuritySettings | None = None, options=()) -> grpc.Channel:
    """A blocking channel (health checks of ``llmfleet up``) with the same TLS as :func:`open_channel`."""
    creds = channel_credentials(security or current())
    opts = [*CHANNEL_OPTIONS, *options]
    if creds is None:
        return grpc.insecure_channel(address, options=opts)
    return grpc.secure_channel(address, creds, options=opts)
