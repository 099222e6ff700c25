"""``--workers N``: N front processes serving one HTTP port (SO_REUSEPORT: the kernel spreads the
connections over them), started and restarted by the parent, which itself serves no HTTP.

Each worker is the same program with ``--workers 1``, no gRPC port, no /metrics and its own node id
(``<id>-w<i>``). The parent keeps the port bound (not listening) while it runs, so a port picked by
the kernel (``--http-port 0``) stays this front's while workers restart."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmfleet.procs import with_pdeathsig

log = logging.getLogger(__name__)

RESTART_S = 1.0  # a worker that exits is started again after this long


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
class Workers:
    """Runs ``count`` workers from ``argv`` (the parent's flags) until :meth:`stop`."""

    argv: Sequence[str]
    node_id: str
    http_port: int
    count: int
    procs: list[subprocess.Popen] = field(default_factory=list)
    restarts: int = 0
    _stopping: bool = False

    def start(self) -> None:
        self.procs = [self._spawn(i) for i in range(self.count)]
        log.info("front: %d workers on HTTP port %d (pids %s)", self.count, self.http_port,
                 [p.pid for p in self.procs])  # fmt: skip

    def _spawn(self, index: int) -> subprocess.Popen:
        argv = worker_argv(self.argv, self.node_id, index, self.http_port)
        return subprocess.Popen(with_pdeathsig(argv))  # its output goes where the parent's goes

    async def supervise(self) -> None:
        """Start a worker again when it exits (until stopped)."""
        while not self._stopping:
            await asyncio.sleep(RESTART_S)
            for i, p in enumerate(self.procs):
                if p.poll() is not None and not self._stopping:
                    log.warning("front worker %d (pid %d) exited with %s; starting it again", i, p.pid,
                                p.returncode)  # fmt: skip
                    self.restarts += 1
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
