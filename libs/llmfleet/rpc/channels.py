"""Client channels with tracing interceptors and keep-alive settings suitable for long streams."""

from __future__ import annotations

import grpc

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


def open_channel(address: str) -> grpc.aio.Channel:
    """An insecure grpc.aio channel to ``host:port`` with tracing when it is enabled."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=client_interceptors())
