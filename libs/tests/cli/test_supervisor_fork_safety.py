"""Regression: children spawned while the parent's gRPC threads are busy must start.

With a ``preexec_fn`` (Python run in the forked child of a multi-threaded parent) about one child in
seven died before exec (SIGSEGV / SIGABRT, an empty log) when gRPC was busy in another thread; the
chaos suite saw restarted engines, placement and migration replicas vanish that way. The supervisor
now sets PR_SET_PDEATHSIG from an exec shim instead (``with_pdeathsig``)."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections import Counter
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from llmfleet.coord import LocalEtcd
from llmfleet.supervisor import ProcessGroup, with_pdeathsig

SPAWNS = 100


def _busy_grpc(stop: threading.Event, ready: threading.Event) -> None:
    async def main() -> None:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            ready.set()
            while not stop.is_set():
                await asyncio.gather(*(stub.Check(health_pb2.HealthCheckRequest()) for _ in range(50)))
        await server.stop(0)

    asyncio.run(main())


def test_children_start_while_grpc_threads_are_busy(tmp_path: Path) -> None:
    stop, ready = threading.Event(), threading.Event()
    t = threading.Thread(target=_busy_grpc, args=(stop, ready), daemon=True)
    t.start()
    try:
        assert ready.wait(30)
        exits: Counter[int | None] = Counter()
        with ProcessGroup(tmp_path) as group:
            for _ in range(SPAWNS):
                exits[group.spawn("c", ["true"]).wait(30)] += 1
        assert exits == {0: SPAWNS}, f"exit codes of {SPAWNS} children: {dict(exits)}"
    finally:
        stop.set()
        t.join(30)


def test_the_shim_keeps_the_pid_and_sets_the_death_signal() -> None:
    import subprocess

    code = "import os; print(os.getpid()); print(open(f'/proc/{os.getpid()}/status').read())"
    proc = subprocess.run(
        with_pdeathsig([sys.executable, "-c", code], signal.SIGKILL),
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(proc.stdout.splitlines()[0])
    assert pid > 0
    if sys.platform.startswith("linux"):
        # the shim exec'd the command: no extra process in between (its parent is us)
        ppid = next(int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("PPid:"))
        import os

        assert ppid == os.getpid()


def test_local_etcd_starts_while_grpc_threads_are_busy(tmp_path: Path) -> None:
    stop, ready = threading.Event(), threading.Event()
    t = threading.Thread(target=_busy_grpc, args=(stop, ready), daemon=True)
    t.start()
    try:
        assert ready.wait(30)
        etcd = LocalEtcd(tmp_path / "etcd")
        for _ in range(3):
            etcd.start()
            etcd.kill()
    finally:
        stop.set()
        t.join(30)
