"""Services managed at runtime on a real cluster (etcd, a scheduler, two placement replicas with the
``aladdin`` planner, two CPU engines), through the CLI as a user runs it.

``llmfleet apply`` adds a service on a new model → it is listed, the leader places the model and
requests to it complete through the scheduler; its SLO changes → describe and etcdctl show it and
neither a resync nor a new leader reverts it; ``llmfleet services delete`` → requests to it fail with
NOT_FOUND naming it and its model is released; a bad file → exit 1 naming the field.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from harness import BIN, Cluster
from llmfleet.client import AsyncClient, NotFound, Unavailable
from llmfleet.coord import LocalEtcd
from llmfleet.supervisor import ProcessGroup

ENGINES = ["engine-0", "engine-1"]
CONFIG = {
    "services": {"chat": {"model": "tiny-llama", "max_tokens": 8}},
    "models": {"tiny-llama": {"source": "tiny://llama"}},
    "engines": {eid: {} for eid in ENGINES},
    "placement": {
        "policy": "aladdin",
        "interval_s": 1.0,
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    root = tmp_path_factory.mktemp("services-runtime")
    config_path = root / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(CONFIG))
    etcd = LocalEtcd(root / "etcd").start()
    c = Cluster(
        root, etcd, ProcessGroup(root / "logs"), f"/it-{uuid.uuid4().hex[:8]}", config_path, root / "models"
    )
    try:
        c.start("scheduler", "llmfleet-scheduler", "--orphan-grace-s", "0.5", "--http-port", "-1")
        for i in range(2):
            c.start(f"placement-{i}", "llmfleet-placement", "--config", str(config_path), "--resync-s", "1")
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


def cli(c: Cluster, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "llmfleet"), *argv, "--etcd", c.etcd.endpoint, "--prefix", c.prefix],
        capture_output=True,
        text=True,
        timeout=60,
    )


def services(c: Cluster) -> dict[str, dict]:
    out = cli(c, "services", "list", "--json")
    assert out.returncode == 0, out.stderr
    return {r["name"]: r for r in json.loads(out.stdout)}


def until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.3)


def placement_leader(c: Cluster) -> str:
    return next((r["leader"] for r in c.status()["leaders"] if r["role"] == "placement"), "")


def etcdctl_get(c: Cluster, key: str) -> str:
    out = subprocess.run(
        [str(LocalEtcd.etcdctl_path()), "--endpoints", c.etcd.endpoint, "get", "--print-value-only", key],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip()


async def complete(c: Cluster, service: str, timeout: float = 60.0):
    """A request to ``service``, retried while its model is still being placed (UNAVAILABLE)."""
    deadline = time.monotonic() + timeout
    async with AsyncClient(c.scheduler, timeout_s=30, retries=0) as client:
        while True:
            try:
                return await client.complete("hello fleet", service=service, max_tokens=4)
            except Unavailable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


async def test_apply_change_delete_a_service_at_runtime(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    # the cluster file seeded services/ once; chat gets an engine
    until(lambda: services(c).get("chat", {}).get("loaded_on"), 120, "chat to be placed and loaded")
    assert set(services(c)) == {"chat"}

    f = tmp_path / "qa.yaml"
    f.write_text(QA)
    out = cli(c, "apply", "-f", str(f), "--dry-run")
    assert out.returncode == 0 and "service qa created" in out.stdout and "nothing written" in out.stdout
    assert "qa" not in services(c)
    out = cli(c, "apply", "-f", str(f))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "model tiny-qwen2 created",
        "service qa created",
        "applied: 2 created, 0 updated, 0 unchanged",
    ]
    assert services(c)["qa"]["ttft_s"] == 3.0
    # the leader places the new model; the scheduler routes to the new service
    row = until(lambda: services(c)["qa"]["loaded_on"], 120, "tiny-qwen2 to be placed and loaded")
    done = await complete(c, "qa")
    assert done.usage.completion_tokens == 4 and done.usage.engine_id in row
    assert (await complete(c, "chat")).usage.completion_tokens == 4

    # change its SLO: shown at once, kept across the leader's resyncs and a leader change
    f.write_text(QA.replace("ttft_s: 3.0", "ttft_s: 1.25"))
    out = cli(c, "apply", "-f", str(f))
    assert out.returncode == 0 and "service qa updated: slo.ttft_s: 3 -> 1.25" in out.stdout, out.stderr
    leader = until(lambda: placement_leader(c), 10, "a placement leader")
    time.sleep(3.5)  # > 3 resyncs (--resync-s 1)
    c.procs.kill(leader)
    until(lambda: placement_leader(c) not in ("", leader), 30, "a new placement leader")
    time.sleep(2.5)
    out = cli(c, "services", "describe", "qa")
    doc = yaml.safe_load(out.stdout)
    assert out.returncode == 0 and doc["service"]["slo"]["ttft_s"] == 1.25 and doc["model"]["source"]
    assert json.loads(etcdctl_get(c, f"{c.prefix}/services/qa"))["slo"]["ttft_s"] == 1.25
    assert (await complete(c, "qa")).usage.completion_tokens == 4

    # delete it: NOT_FOUND naming it; the leader releases its model
    out = cli(c, "services", "delete", "qa")
    assert out.returncode == 0 and out.stdout.startswith("service qa deleted"), out.stderr
    assert "qa" not in services(c)

    async def not_found() -> str:
        async with AsyncClient(c.scheduler, timeout_s=30, retries=0) as client:
            with pytest.raises(NotFound) as e:
                await client.complete("hi", service="qa", max_tokens=4)
        return str(e.value)

    assert "'qa'" in await until_async(not_found, 10)
    until(
        lambda: (
            not any("tiny-qwen2" in (n["models"] or []) for n in c.status()["nodes"] if n["role"] == "engine")
        ),
        60,
        "tiny-qwen2 to be released",
    )
    assert (await complete(c, "chat")).usage.completion_tokens == 4

    out = cli(c, "services", "delete", "qa")
    assert out.returncode == 1 and "no service 'qa' (known: chat)" in out.stderr
    f.write_text(QA.replace("ttft_s: 3.0", "ttft_s: -1"))
    out = cli(c, "apply", "-f", str(f))
    assert out.returncode == 1 and "services.qa.slo: ttft_s must be a positive number, got -1" in out.stderr
    assert "qa" not in services(c)


async def until_async(fn, timeout: float):
    """``await fn()`` until it stops raising AssertionError/Failed (the scheduler's view catching up)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await fn()
        except (AssertionError, pytest.fail.Exception):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)
