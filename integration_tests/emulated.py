"""``llmfleet up --emulate`` for the emulated-fleet tests: a cluster config written to ``tmp``, started as
a user starts it (own etcd, free ports, no HTTP API), "up" when ``endpoints.json`` appears; stopped with
Ctrl-C. Also ``status`` (``llmfleet status --json``) and ``wait_status`` on that fleet's etcd."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from llmfleet.supervisor import free_port

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def emulated_up(
    tmp: Path, config: dict[str, Any], gpus: int, processes: int, hardware: str = "A100-80GB", ttl: int = 3
) -> Iterator[tuple[dict, Path]]:
    """Yields (endpoints, state dir)."""
    cfg = tmp / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(config))
    state = tmp / "state"
    out = open(tmp / "up.out", "w")  # noqa: SIM115 - closed after up exits
    up = subprocess.Popen(
        [
            str(BIN / "llmfleet"), "up", "--config", str(cfg), "--state-dir", str(state),
            "--emulate", f"{gpus}x{hardware}", "--emulate-processes", str(processes),
            "--etcd-port", "0", "--base-port", str(free_port()), "--http-port", "-1", "--ttl", str(ttl),
        ],
        stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    endpoints_file = state / "endpoints.json"
    try:
        deadline = time.monotonic() + 240
        while not endpoints_file.exists():
            assert up.poll() is None, (tmp / "up.out").read_text()
            assert time.monotonic() < deadline, "llmfleet up --emulate did not become ready"
            time.sleep(0.5)
        yield json.loads(endpoints_file.read_text()), state
    finally:
        os.killpg(up.pid, signal.SIGINT)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
        out.close()


def status(etcd: str) -> dict:
    env = os.environ | {"LLMFLEET_ETCD": etcd}
    st = subprocess.run(
        [str(BIN / "llmfleet"), "status", "--json"], capture_output=True, text=True, timeout=60, env=env
    )
    assert st.returncode == 0, st.stderr
    return json.loads(st.stdout)


def wait_status(etcd: str, predicate: Callable[[dict], bool], timeout: float, what: str) -> dict:
    deadline, last = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        last = status(etcd)
        if predicate(last):
            return last
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}: {json.dumps(last.get('fleet'), indent=1)[:3000]}")


def engines(st: dict) -> list[dict]:
    return [n for n in st["nodes"] if n["role"] == "engine"]


def write_trace(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    """A trace ``llmfleet load/sim --trace`` read: (seconds, prompt tokens, output tokens) rows."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens", *(f"{t:.3f},{p},{o}" for t, p, o in rows)]
    path.write_text("\n".join(lines) + "\n")
    return path
