"""``--workers N``: N front processes serving one HTTP port (SO_REUSEPORT: the kernel spreads the
connections over them), started and restarted by the parent, which itself serves no HTTP.

Each worker is the same program with ``--workers 1``, no gRPC port, no /metrics and its own node id
(``<id>-w<i>``). The parent keeps the port bound (not listening) while it runs, so a port picked by
the kernel (``--http-port 0``) stays this front's while workers restart.

Metrics (``WorkerMetrics``): a scrape of the shared HTTP port would land on one worker, so the workers
serve none; each writes its ``llmfleet_front_*`` values to files of its own in a directory the parent
made (prometheus-client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR`` in the workers' environment),
and the parent's ``/metrics`` sums the files at each scrape. A worker's counters stay in the sum after it
exits (the totals never go back); its gauges leave it (``mark_process_dead``)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from llmfleet.procs import with_pdeathsig
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

log = logging.getLogger(__name__)

RESTART_S = 1.0  # a worker that exits is started again after this long
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's multiprocess mode reads it at import


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to ``host:port`` with SO_REUSEPORT, holding the port for the
    workers (``port`` 0: a free one, see ``getsockname()``). OSError when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def worker_argv(argv: Sequence[str], node_id: str, index: int, http_port: int) -> list[str]:
    """The command line of worker ``index``: the parent's flags, with ``--workers 1``, the port the
    parent holds, no gRPC port and no /metrics."""
    args = list(argv)
    overrides = {
        "--workers": "1",
        "--http-port": str(http_port),
        "--port": "-1",
        "--metrics-port": "-1",
        "--id": f"{node_id}-w{index}",
    }
    for flag, value in overrides.items():
        for i, a in enumerate(args):
            if a == flag and i + 1 < len(args):
                args[i + 1] = value
                break
            if a.startswith(flag + "="):
                args[i] = f"{flag}={value}"
                break
        else:
            args += [flag, value]
    return [sys.executable, "-m", "llmfleet_front.main", *args]


@dataclass
class WorkerMetrics:
    """The workers' metrics files (a fresh directory) and the collector that sums them on ``registry``
    (the parent's /metrics). :meth:`env`: what a worker's environment adds; :meth:`exited`: a worker's
    gauges leave the sum; :meth:`close`: the collector is removed and the directory deleted."""

    registry: CollectorRegistry
    path: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="llmfleet-front-metrics-"))

    def __post_init__(self) -> None:
        self._collector = MultiProcessCollector(self.registry, path=self.path)  # registers itself

    def env(self) -> dict[str, str]:
        return {MULTIPROC_ENV: self.path}

    def exited(self, pid: int) -> None:
        mark_process_dead(pid, self.path)

    def close(self) -> None:
        self.registry.unregister(self._collector)
        shutil.rmtree(self.path, ignore_errors=True)


@dataclass
class Workers:
    """Runs ``count`` workers from ``argv`` (the parent's flags) until :meth:`stop`; ``env``: added to
    each worker's environment; ``on_exit``: hears the pid of each worker that exited."""

    argv: Sequence[str]
    node_id: str
    http_port: int
    count: int
    env: Mapping[str, str] = field(default_factory=dict)
    on_exit: Callable[[int], None] | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)
    restarts: int = 0
    _stopping: bool = False

    def start(self) -> None:
        self.procs = [self._spawn(i) for i in range(self.count)]
        log.info("front: %d workers on HTTP port %d (pids %s)", self.count, self.http_port,
                 [p.pid for p in self.procs])  # fmt: skip

    def _spawn(self, index: int) -> subprocess.Popen:
        argv = worker_argv(self.argv, self.node_id, index, self.http_port)
        env = {**os.environ, **self.env}
        return subprocess.Popen(with_pdeathsig(argv), env=env)  # its output goes where the parent's goes

    async def supervise(self) -> None:
        """Start a worker again when it exits (until stopped)."""
        while not self._stopping:
            await asyncio.sleep(RESTART_S)
            for i, p in enumerate(self.procs):
                if p.poll() is not None and not self._stopping:
                    log.warning("front worker %d (pid %d) exited with %s; starting it again", i, p.pid,
                                p.returncode)  # fmt: skip
                    self.restarts += 1
                    self._exited(p)
                    self.procs[i] = self._spawn(i)

    async def stop(self, grace_s: float = 10.0) -> None:
        self._stopping = True
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                await asyncio.to_thread(p.wait, grace_s)
            except subprocess.TimeoutExpired:
                p.kill()
                await asyncio.to_thread(p.wait)
            self._exited(p)

    def _exited(self, p: subprocess.Popen) -> None:
        if self.on_exit is not None:
            self.on_exit(p.pid)
