"""`llmfleet up` (what `make run` runs) with the shipped cluster config: everything comes up, the
endpoints are printed, `llmfleet submit` streams text, Ctrl-C stops every child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from llmfleet.supervisor import free_port

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_up_serves_and_stops_cleanly(tmp_path):
    base = free_port()  # a free block is likely just above a free port; up fails loudly otherwise
    state = tmp_path / "state"
    out = open(tmp_path / "up.out", "w")  # noqa: SIM115 - closed in finally, after up exits
    up = subprocess.Popen(
        [
            str(BIN / "llmfleet"),
            "up",
            "--state-dir",
            str(state),
            "--etcd-port",
            "0",
            "--base-port",
            str(base),
            "--ttl",
            "3",
            "--config",
            str(ROOT / "deploy/local/cluster.yaml"),
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        start_new_session=True,
    )
    endpoints_file = state / "endpoints.json"
    try:
        deadline = time.monotonic() + 180
        while not endpoints_file.exists():
            assert up.poll() is None, (tmp_path / "up.out").read_text()
            assert time.monotonic() < deadline, "llmfleet up did not become healthy"
            time.sleep(0.5)
        endpoints = json.loads(endpoints_file.read_text())
        assert {"etcd", "scheduler", "profiler", "placement", "migration", "engine-0", "engine-1"} <= set(
            endpoints
        )
        printed = (tmp_path / "up.out").read_text()
        assert endpoints["scheduler"]["address"] in printed
        pids = [e["pid"] for e in endpoints.values() if e.get("pid")]

        # the engines load their placement asynchronously; submit retries until the model is up
        deadline = time.monotonic() + 120
        while True:
            sub = subprocess.run(
                [
                    str(BIN / "llmfleet"),
                    "submit",
                    "Once upon a time",
                    "--service",
                    "chat",
                    "--max-tokens",
                    "12",
                    "--scheduler",
                    endpoints["scheduler"]["address"],
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if sub.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert sub.returncode == 0, sub.stderr
        assert "12 completion tokens" in sub.stderr and sub.stdout
    finally:
        up.send_signal(signal.SIGINT)
        rc = up.wait(timeout=60)
        out.close()
    assert rc == 0, (tmp_path / "up.out").read_text()
    deadline = time.monotonic() + 10  # up has waited for each child; allow the kernel to reap them
    while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "children left behind after Ctrl-C"
