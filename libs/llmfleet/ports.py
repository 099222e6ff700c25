"""Free TCP ports for local processes (tests, ``llmfleet up`` with port 0, the local etcd)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_PORTS = (20000, 32000)  # below Linux's ephemeral range (32768-60999 by default)


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual race applies: bind it soon).

    Picked at random below the kernel's ephemeral range when it can be: a port the kernel hands out
    for ``bind(0)`` is also where it picks the source ports of outgoing connections, so one of those
    (a test's gRPC client) could take it before the service binds it."""
    lo, hi = _PORTS[0], min(_PORTS[1], _ephemeral_floor() - 1)
    for _ in range(64 if hi > lo else 0):
        port = random.randint(lo, hi)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
