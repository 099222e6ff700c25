"""A service started while etcd is unreachable keeps serving health, logs that it retries, and
registers as soon as etcd appears."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmfleet.coord import LocalEtcd
from llmfleet.supervisor import ProcessGroup, free_port

BIN = Path(sys.executable).parent


def test_service_survives_etcd_absent_at_start(tmp_path):
    etcd_port = free_port()
    port = free_port()
    with ProcessGroup(tmp_path / "logs") as group:
        child = group.spawn(
            "profiler",
            [
                str(BIN / "llmfleet-profiler"),
                "--etcd",
                f"127.0.0.1:{etcd_port}",
                "--port",
                str(port),
                "--id",
                "p1",
                "--ttl",
                "2",
            ],
        )
        group.wait_healthy(child, f"127.0.0.1:{port}", timeout=60)
        deadline = time.monotonic() + 30
        while "etcd unreachable" not in child.log_path.read_text():
            assert time.monotonic() < deadline, child.log_tail()
            time.sleep(0.2)
        time.sleep(1.0)
        assert child.alive, "a service must not exit while etcd is down"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING

        etcd = LocalEtcd(tmp_path / "etcd", client_port=etcd_port).start()
        try:
            deadline = time.monotonic() + 30
            while True:
                out = subprocess.run(
                    [
                        str(LocalEtcd.etcdctl_path()),
                        "--endpoints",
                        etcd.endpoint,
                        "get",
                        "/llmfleet/nodes/p1",
                        "--print-value-only",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                if '"role": "profiler"' in out.stdout:
                    break
                assert time.monotonic() < deadline, child.log_tail()
                time.sleep(0.3)
        finally:
            group.stop_all(grace=10, together=True)
            etcd.stop()
