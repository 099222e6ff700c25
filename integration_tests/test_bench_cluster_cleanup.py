"""A benchmark that starts ``llmfleet up`` (``tools.bench.local_up.LocalUp``) and is stopped by SIGTERM
stops the cluster it started: the cluster runs in its own session, so without the benchmark's own
handling its etcd, placement and engines would keep running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import sys, time, yaml
    from pathlib import Path
    from tools.bench.local_up import LocalUp

    if __name__ == "__main__":
        config = yaml.safe_load((Path("deploy/local/cluster.yaml")).read_text())
        up = LocalUp(Path(sys.argv[1]), config, "--emulate", "2xA100-80GB")
        up.start()
        try:
            print(up.proc.pid, flush=True)
            time.sleep(600)
        finally:
            print("finally", flush=True)
            up.stop()
    """
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigterm_to_a_benchmark_stops_its_cluster(tmp_path):
    script = tmp_path / "bench_child.py"
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "up")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    cluster: list[int] = []
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # the cluster is up
        assert line.strip().isdigit(), (tmp_path / "up" / "up.out").read_text()[-3000:]
        up_pid = int(line)
        cluster = [up_pid, *(p.pid for p in psutil.Process(up_pid).children(recursive=True))]
        assert len(cluster) > 2  # up, etcd and the services
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 128 + signal.SIGTERM
        assert "finally" in out
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in cluster) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [p for p in cluster if _alive(p)] == []
    finally:
        if child.poll() is None:
            child.kill()
        for pid in cluster:  # what a failing run left behind
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
