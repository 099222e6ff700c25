"""``llmfleet up`` as a user starts it, for benchmarks: a cluster config written to a fresh directory,
a free port range and a local etcd on a free port; "up" is when ``endpoints.json`` appears (``up``
writes it right after printing "llmfleet is up"); stopped with Ctrl-C (SIGINT) to the process group.

The cluster runs in its own session, so a signal to the benchmark does not reach it: a benchmark process
that starts one turns SIGTERM and SIGHUP into ``SystemExit`` (its ``finally`` blocks stop what they
started) and stops every cluster still running when it exits."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml
from llmfleet.supervisor import free_port as free

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    return free()


_RUNNING: set[LocalUp] = set()  # clusters started by this process and not stopped yet


def _stop_running() -> None:
    for up in list(_RUNNING):
        up.stop()


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _stop_clusters_on_exit() -> None:
    """Once per process: SIGTERM/SIGHUP (left at their defaults) exit through ``finally`` blocks, and
    every cluster still running is stopped at exit."""
    atexit.unregister(_stop_running)  # registered once however many clusters start
    atexit.register(_stop_running)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _exit_on_signal)


class LocalUp:
    """One ``llmfleet up`` run in ``directory`` (its config, state, and output ``up.out``)."""

    def __init__(self, directory: Path, config: dict[str, Any], *up_args: str) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "cluster.yaml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        self.up_args = list(up_args)
        self.proc: subprocess.Popen | None = None
        self.endpoints: dict[str, Any] = {}
        self.etcd = ""
        self.scheduler = ""

    def start(self, timeout_s: float = 600.0) -> float:
        """Launch and wait for "up"; returns the launch time (``time.monotonic()``)."""
        state = self.dir / "state"
        shutil.rmtree(state, ignore_errors=True)  # each run starts from nothing (no etcd data, no logs)
        self.log = open(self.dir / "up.out", "w")  # noqa: SIM115 - closed in stop()
        t0 = time.monotonic()
        _stop_clusters_on_exit()
        self.proc = subprocess.Popen(
            [
                str(BIN / "llmfleet"), "up", "--config", str(self.config), "--state-dir", str(state),
                "--etcd-port", "0", "--base-port", str(free_port()), "--http-port", "-1", *self.up_args,
            ],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
        _RUNNING.add(self)
        endpoints = state / "endpoints.json"
        while not endpoints.exists():
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                self.stop()
                raise RuntimeError((self.dir / "up.out").read_text()[-4000:])
            time.sleep(0.05)
        self.endpoints = json.loads(endpoints.read_text())
        self.etcd = self.endpoints["etcd"]["address"]
        self.scheduler = self.endpoints["scheduler"]["address"]
        return t0

    def cli(self, *argv: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        """``llmfleet ARGV`` against this cluster's etcd."""
        env = os.environ | {"LLMFLEET_ETCD": self.etcd}
        return subprocess.run(
            [str(BIN / "llmfleet"), *argv], capture_output=True, text=True, timeout=timeout_s, env=env
        )

    def status(self) -> dict:
        out = self.cli("status", "--json")
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def log_text(self, name: str) -> str:
        path = self.dir / "state" / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def engines(self) -> int:
        """Engine nodes registered in etcd."""
        return sum(1 for n in self.status().get("nodes", []) if n["role"] == "engine")

    def processes_by_name(self) -> dict[str, psutil.Process]:
        """Every process of the cluster, by a short name (``etcd``, ``scheduler``, ``emu0``, ...)."""
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        out: dict[str, psutil.Process] = {"up": root}
        for p in root.children(recursive=True):
            try:
                argv = p.cmdline()
            except psutil.Error:
                continue
            name = p.name()
            if "--id" in argv:
                name = argv[argv.index("--id") + 1]
            elif "etcd" in name:
                name = "etcd"
            out[name if name not in out else f"{name}-{p.pid}"] = p
        return out

    def rss_bytes(self) -> dict[str, int]:
        """Resident bytes of every process of the cluster, by ``"{pid} {name}"``."""
        out = {}
        for name, p in self.processes_by_name().items():
            try:
                out[f"{p.pid} {name}"] = p.memory_info().rss
            except psutil.Error:
                continue
        return out

    def stop(self) -> None:
        _RUNNING.discard(self)
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        if hasattr(self, "log"):
            self.log.close()
