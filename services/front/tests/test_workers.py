"""``--workers N``: each worker's command line, the port the parent holds for them, and their metrics
summed from the files each writes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from llmfleet.metrics.server import samples
from llmfleet_front.workers import WorkerMetrics, reserve_port, worker_argv
from prometheus_client import CollectorRegistry


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


# what a worker does with its metrics: a request answered, a SubmitMany call open
_WORKER = """
from llmfleet.metrics.control import front_metrics
m = front_metrics()
m.requests.labels("/v1/completions", "200").inc()
m.call_opened(True)
"""


def test_the_parent_sums_its_workers_metrics_and_drops_an_exited_workers_gauges() -> None:
    registry = CollectorRegistry()
    files = WorkerMetrics(registry)
    key = 'llmfleet_front_requests_total{route="/v1/completions",status="200"}'
    try:
        pids = []
        for _ in range(2):  # two worker processes, each with the environment Workers gives it
            p = subprocess.Popen([sys.executable, "-c", _WORKER], env={**os.environ, **files.env()})
            assert p.wait(timeout=60) == 0
            pids.append(p.pid)
        m = samples(registry)
        assert m[key] == 2 and m["llmfleet_front_submit_many_calls"] == 2
        files.exited(pids[0])  # its counters stay in the totals, its gauges leave the sum
        m = samples(registry)
        assert m[key] == 2 and m["llmfleet_front_submit_many_calls"] == 1
    finally:
        files.close()
    assert not Path(files.path).exists()
    assert not any(k.startswith("llmfleet_front_") for k in samples(registry))
