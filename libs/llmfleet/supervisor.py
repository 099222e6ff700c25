"""Run and supervise a group of child processes (``llmfleet up`` and the integration tests).

    with ProcessGroup() as group:
        child = group.spawn("scheduler", ["llmfleet-scheduler", "--port", "50051"], log_path=logs / "s.log")
        group.wait_healthy(child, "127.0.0.1:50051", timeout=30)
        ...
    # leaving the block stops every child: SIGTERM in reverse start order, SIGKILL after the grace

Children never outlive the parent: each gets PR_SET_PDEATHSIG(SIGTERM) on Linux (set by a tiny exec
shim, :func:`llmfleet.procs.with_pdeathsig`, not a ``preexec_fn``: see there), so they are sent
SIGTERM when the thread that spawned them dies (spawn from the main thread or another long-lived one,
never from a short-lived worker thread). Each child runs in its own session, so a terminal's
Ctrl-C reaches only the parent, which then stops the children in order; signals from stop/kill go to
the child's whole process group, so grandchildren are stopped too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from llmfleet.ports import free_port as free_port  # re-exported: tests and tools import it from here
from llmfleet.procs import LOG_TAIL_LINES, check_executable, describe_returncode, tail, with_pdeathsig
from llmfleet.rpc.channels import open_sync_channel

log = logging.getLogger(__name__)

__all__ = [
    "Child",
    "ChildExited",
    "HealthTimeout",
    "ProcessGroup",
    "SupervisorError",
    # from llmfleet.ports and llmfleet.procs, importable from here too
    "describe_returncode",
    "free_port",
    "tail",
    "with_pdeathsig",
]


class SupervisorError(RuntimeError):
    """Base class for supervisor failures."""


class ChildExited(SupervisorError):
    """A child exited while we were waiting for it (the message includes its log tail)."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self.returncode = child.returncode
        self.log_tail = child.log_tail()
        super().__init__(
            f"{child.name} (pid {child.pid}) exited with {describe_returncode(child.returncode)}"
            f"; log {child.log_path}:\n{self.log_tail}"
        )


class HealthTimeout(SupervisorError, TimeoutError):
    """A child did not report SERVING in time (the message includes its log tail)."""

    def __init__(self, child: Child, address: str, timeout: float, last_error: str) -> None:
        self.child = child
        self.log_tail = child.log_tail()
        super().__init__(
            f"{child.name} (pid {child.pid}) not healthy at {address} after {timeout:.1f}s ({last_error})"
            f"; log {child.log_path}:\n{self.log_tail}"
        )


@dataclass
class Child:
    """One supervised process."""

    name: str
    argv: list[str]
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.time)
    env: dict[str, str] = field(default_factory=dict)  # what spawn added to the environment
    restarts: int = 0  # times this name was started again after an exit

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, n)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's process group (no-op once it has exited)."""
        if not self.alive:
            return
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None if still running after ``timeout`` seconds."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def __repr__(self) -> str:
        return f"Child({self.name!r}, pid={self.pid}, {describe_returncode(self.returncode)})"


class ProcessGroup:
    """Spawns, health-checks and stops child processes; a context manager that stops all on exit."""

    def __init__(self, log_dir: str | Path | None = None) -> None:
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._children: dict[str, Child] = {}
        self._reported: set[int] = set()

    @property
    def children(self) -> list[Child]:
        """Children in start order (including ones that exited)."""
        return list(self._children.values())

    def __getitem__(self, name: str) -> Child:
        try:
            return self._children[name]
        except KeyError:
            raise KeyError(f"no child named {name!r}; known: {sorted(self._children)}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._children

    def _default_log(self, name: str) -> Path:
        if self._log_dir is None:
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="llmfleet-logs-")
            self._log_dir = Path(self._tmp.name)
        return self._log_dir / f"{name}.log"

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        log_path: str | Path | None = None,
        cwd: str | Path | None = None,
    ) -> Child:
        """Start ``argv`` with stdout+stderr appended to ``log_path`` (default: ``<log_dir>/<name>.log``).

        ``env`` is added to (and overrides) this process's environment. A name may be reused once
        its previous child has exited (restart).
        """
        old = self._children.get(name)
        if old is not None and old.alive:
            raise SupervisorError(f"a child named {name!r} is already running (pid {old.pid})")
        path = Path(log_path) if log_path is not None else self._default_log(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(path, "ab") as logf:
            logf.write(
                f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name}: {' '.join(argv)}\n".encode()
            )
            logf.flush()
            try:
                check_executable(argv, full_env, cwd)
                proc = subprocess.Popen(
                    with_pdeathsig(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    env=full_env,
                    cwd=cwd,
                    start_new_session=True,
                )
            except OSError as e:
                raise SupervisorError(f"cannot start {name}: {argv[0]}: {e}") from e
        if old is not None:
            self._children.pop(name)  # re-insert at the end: stop order follows the latest start
        child = Child(
            name=name, argv=list(argv), process=proc, log_path=path, env=dict(env or {}),
            restarts=old.restarts + 1 if old is not None else 0,
        )  # fmt: skip
        self._children[name] = child
        log.info("started %s (pid %d): %s", name, proc.pid, " ".join(argv))
        return child

    def wait_healthy(
        self,
        child: Child | str,
        grpc_address: str,
        service: str = "",
        timeout: float = 30.0,
        interval: float = 0.1,
    ) -> None:
        """Block until ``grpc.health.v1.Health/Check(service)`` at ``grpc_address`` answers SERVING.

        Raises :class:`ChildExited` as soon as the child exits and :class:`HealthTimeout` after
        ``timeout`` seconds; both carry the child's log tail.
        """
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        c = self[child] if isinstance(child, str) else child
        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500)]
        with open_sync_channel(grpc_address, options=options) as channel:  # TLS as this process's settings
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if not c.alive:
                    raise ChildExited(c)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HealthTimeout(c, grpc_address, timeout, last_error)
                try:
                    resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=min(1.0, left))
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        log.info("%s healthy at %s", c.name, grpc_address)
                        return
                    last_error = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
                except grpc.RpcError as e:
                    last_error = f"{e.code().name}: {e.details()}"
                time.sleep(min(interval, max(0.0, deadline - time.monotonic())))

    async def wait_healthy_async(
        self, child: Child | str, grpc_address: str, service: str = "", timeout: float = 30.0
    ) -> None:
        """:meth:`wait_healthy` without blocking the event loop."""
        import asyncio

        await asyncio.to_thread(self.wait_healthy, child, grpc_address, service, timeout)

    def respawn(self, name: str) -> Child:
        """Start an exited child again with the same command, environment and log file."""
        old = self[name]
        return self.spawn(name, old.argv, env=old.env, log_path=old.log_path)

    def poll_exited(self) -> list[Child]:
        """Children that exited since the last call (each reported once)."""
        out = []
        for c in self._children.values():
            if not c.alive and c.pid not in self._reported:
                self._reported.add(c.pid)
                out.append(c)
        return out

    def stop(self, name: str, grace: float = 10.0) -> int | None:
        """SIGTERM one child, SIGKILL after ``grace`` seconds; returns its exit code."""
        return self._stop(self[name], grace)

    def kill(self, name: str, sig: int = signal.SIGKILL, wait: bool = True) -> int | None:
        """Send ``sig`` (default SIGKILL, i.e. a crash) to a child; returns its exit code when waited."""
        child = self[name]
        child.signal(sig)
        return child.wait() if wait else None

    def stop_all(self, grace: float = 10.0, together: bool = False) -> None:
        """Stop every child in reverse start order: SIGTERM, then SIGKILL after ``grace`` seconds each.
        ``together``: SIGTERM them all at once and wait for them in parallel (``grace`` seconds in all
        before the stragglers are killed); for a cluster being torn down, where no child needs another
        to outlive it (each service's own shutdown takes up to a few seconds, so one by one adds up)."""
        children = list(reversed(list(self._children.values())))
        if not together:
            for child in children:
                self._stop(child, grace)
            return
        for child in children:
            if child.alive:
                child.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in children:
            self._stop(child, max(0.05, deadline - time.monotonic()), signalled=True)

    def close(self) -> None:
        """stop_all(0) and drop temporary log files."""
        self.stop_all(grace=0)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    @staticmethod
    def _stop(child: Child, grace: float, signalled: bool = False) -> int | None:
        if not child.alive:
            return child.returncode
        if not signalled:
            child.signal(signal.SIGTERM)
        rc = child.wait(grace) if grace > 0 else child.wait(0.05)
        if rc is None:
            log.warning("%s (pid %d) ignored SIGTERM for %.1fs; killing it", child.name, child.pid, grace)
            child.signal(signal.SIGKILL)
            rc = child.wait()
        # the group may still hold grandchildren that ignored SIGTERM
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        log.info("stopped %s (pid %d): %s", child.name, child.pid, describe_returncode(rc))
        return rc

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()
