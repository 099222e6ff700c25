"""``--workers N``: each worker's command line, and the port the parent holds for them."""

from __future__ import annotations

import socket
import sys

import pytest
from llmfleet_front.workers import reserve_port, worker_argv


def test_a_workers_flags_are_the_parents_with_its_own_id_port_and_no_grpc_or_metrics() -> None:
    argv = worker_argv(
        ["--id", "front", "--port", "50055", "--http-port=0", "--workers", "4", "--etcd", "e:1"],
        "front",
        2,
        8123,
    )
    assert argv[:3] == [sys.executable, "-m", "llmfleet_front.main"]
    args = argv[3:]
    flags = {
        args[i]: args[i + 1]
        for i in range(0, len(args) - 1)
        if args[i].startswith("--") and "=" not in args[i]
    }
    assert flags["--id"] == "front-w2" and flags["--port"] == "-1" and flags["--workers"] == "1"
    assert "--http-port=8123" in args and flags["--etcd"] == "e:1" and flags["--metrics-port"] == "-1"


def test_the_held_port_is_shared_with_the_workers_and_refused_to_others() -> None:
    held = reserve_port("127.0.0.1", 0)
    port = held.getsockname()[1]
    try:
        worker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        worker.bind(("127.0.0.1", port))  # what HttpServer(reuse_port=True) does in a worker
        worker.listen()
        worker.close()
        other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # a process without SO_REUSEPORT cannot take it
        other.close()
    finally:
        held.close()
