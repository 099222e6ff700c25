"""Requests wait for capacity on a real cluster: etcd, a scheduler with its defaults
(late binding, cold starts held, ready = servable), the aladdin planner with a long interval (30 s,
so only the scheduler's wake-up can place a new model quickly), three CPU engines.

* The scheduler's readiness (health of ``llmfleet.v1.Scheduler``) is NOT_SERVING until ``chat`` has an
  engine with its model loaded, then SERVING; the overall health ``""`` is SERVING from the start.
* Cold start: a service applied at runtime on a model no engine hosts, then 20 SDK requests at once:
  all 20 complete, well before the placement interval (the leader was woken at once).
* A model larger than every engine fails at once with FAILED_PRECONDITION naming the model and the
  largest engine; so does one the placement leader leaves out, as soon as the leader says so. (The
  cold-start timeout itself is timed in services/scheduler/tests/test_capacity_gate.py.)
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import BIN, Cluster
from llmfleet.client import AsyncClient, FailedPrecondition
from llmfleet.coord import LocalEtcd
from llmfleet.supervisor import ProcessGroup

ENGINES = ["engine-0", "engine-1", "engine-2"]
INTERVAL_S = 30.0
CONFIG = {
    "services": {"chat": {"model": "tiny-llama", "max_tokens": 8}},
    "models": {"tiny-llama": {"source": "tiny://llama"}},
    "engines": {eid: {} for eid in ENGINES},
    "placement": {
        "policy": "aladdin",
        "interval_s": INTERVAL_S,
        "confirm_intervals": 1,
        "options": {"k5": 0.0, "c5": 0.0, "min_workers": 1},
        "window_s": 10.0,
    },
}
QA = """
services:
  qa:
    model: tiny-qwen2
    slo: {ttft_s: 3.0, tpot_s: 0.3}
    max_tokens: 6
models:
  tiny-qwen2: {source: "tiny://qwen2"}
"""
HUGE = """
services:
  huge:
    model: big-llama
    slo: {ttft_s: 3.0, tpot_s: 0.3}
models:
  big-llama: {source: "tiny://llama", sim_model: llama2-70b}
"""
NOPLAN = """
services:
  orphan:
    model: odd-model
    slo: {ttft_s: 3.0, tpot_s: 0.3}
    cold_start_timeout_s: 2.0
models:
  odd-model: {source: "tiny://gpt2"}
"""


def readiness(address: str) -> tuple[int, int]:
    """(overall health, the Scheduler service's health)."""
    with grpc.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        overall = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
        sched = stub.Check(health_pb2.HealthCheckRequest(service="llmfleet.v1.Scheduler"), timeout=5).status
    return overall, sched


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    root = tmp_path_factory.mktemp("wait-for-capacity")
    config_path = root / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(CONFIG))
    etcd = LocalEtcd(root / "etcd").start()
    c = Cluster(
        root, etcd, ProcessGroup(root / "logs"), f"/it-{uuid.uuid4().hex[:8]}", config_path, root / "models"
    )
    try:
        c.start("scheduler", "llmfleet-scheduler", "--http-port", "-1", "--stats-interval-s", "1")
        c.wait_healthy(["scheduler"])
        c.first_readiness = readiness(c.scheduler)  # type: ignore[attr-defined]  # before any engine
        c.start("placement", "llmfleet-placement", "--config", str(config_path))
        for eid in ENGINES:
            c.start(
                eid,
                "llmfleet-engine",
                "--models-dir", str(c.models_dir), "--threads", "1", "--offline",
                "--memory-budget", "256MiB", "--drain-timeout-s", "0.2",
            )  # fmt: skip
        c.wait_healthy()
        yield c
    finally:
        c.stop()


def apply(c: Cluster, text: str, tmp_path: Path, name: str) -> None:
    f = tmp_path / f"{name}.yaml"
    f.write_text(text)
    out = subprocess.run(
        [str(BIN / "llmfleet"), "apply", "-f", str(f), "--etcd", c.etcd.endpoint, "--prefix", c.prefix],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def wait_ready(cluster: Cluster) -> None:
    deadline = time.monotonic() + 120
    while readiness(cluster.scheduler)[1] != health_pb2.HealthCheckResponse.SERVING:
        assert time.monotonic() < deadline, "the scheduler never became ready"
        time.sleep(0.2)


def test_ready_means_servable(cluster: Cluster) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    overall, sched = cluster.first_readiness  # type: ignore[attr-defined]
    assert overall == serving  # liveness: up and answering
    assert sched != serving  # not servable: no engine has registered yet
    wait_ready(cluster)
    # ready means a request is served at once, without any retry
    asyncio.run(_one(cluster.scheduler, "chat"))


async def _one(address: str, service: str) -> None:
    async with AsyncClient(address, timeout_s=60, retries=0) as client:
        r = await client.complete("hello fleet", service=service, max_tokens=4)
        assert r.usage.completion_tokens == 4


async def test_cold_start_holds_requests_until_the_model_is_loaded(cluster: Cluster, tmp_path: Path) -> None:
    wait_ready(cluster)
    apply(cluster, QA, tmp_path, "qa")
    t0 = time.monotonic()
    async with AsyncClient(cluster.scheduler, timeout_s=120, retries=0) as client:
        results = await asyncio.gather(
            *(client.complete(f"question {i}", service="qa", max_tokens=4) for i in range(20)),
            return_exceptions=True,
        )
    took = time.monotonic() - t0
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    assert all(r.usage.completion_tokens == 4 for r in results)  # type: ignore[union-attr]
    # the placement leader was woken at once: not one 30 s interval later
    assert took < INTERVAL_S, f"cold start took {took:.1f}s"
    assert "planning now" in cluster.log("placement")  # woken by the scheduler's report


async def test_a_model_too_large_for_every_engine_fails_at_once(cluster: Cluster, tmp_path: Path) -> None:
    wait_ready(cluster)
    apply(cluster, HUGE, tmp_path, "huge")
    t0 = time.monotonic()
    async with AsyncClient(cluster.scheduler, timeout_s=60, retries=0) as client:
        with pytest.raises(FailedPrecondition) as e:
            await client.complete("hi", service="huge", max_tokens=4)
    assert time.monotonic() - t0 < 5
    assert "big-llama" in str(e.value) and "largest engine" in str(e.value)


async def test_a_model_placement_leaves_out_fails_once_the_leader_says_so(
    cluster: Cluster, tmp_path: Path
) -> None:
    wait_ready(cluster)  # still ready: an unservable service applied later does not take it back
    apply(cluster, NOPLAN, tmp_path, "orphan")  # no catalog name: aladdin cannot plan it
    t0 = time.monotonic()
    async with AsyncClient(cluster.scheduler, timeout_s=60, retries=0) as client:
        with pytest.raises(FailedPrecondition) as e:
            await client.complete("hi", service="orphan", max_tokens=4)
    # it waited only until the leader, woken by it, left the service out (not its 2 s timeout, nor
    # the 30 s interval)
    assert time.monotonic() - t0 < 15
    assert "placement does not place model 'odd-model'" in str(e.value) and "catalog" in str(e.value)
