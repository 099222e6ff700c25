"""The live cluster ``llmfleet up`` plans (etcd + control plane + ONE CPU engine) with the benchmark's
engine and scheduler flags, waiting until it serves, and the engine's Profile sweep."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .workload import ENGINE_ID, MODEL, SERVICE, Settings


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_base_port(rng: random.Random) -> int:
    """A base port with every port ``up`` derives from it (control plane, the engine) free."""
    from llmfleet.cli.up import CONTROL_PLANE, ENGINE_PORT_OFFSET

    offsets = [o for *_, o in CONTROL_PLANE] + [ENGINE_PORT_OFFSET]
    for _ in range(200):
        base = rng.randrange(20000, 60000)
        if all(_port_free(base + o) for o in offsets):
            return base
    raise RuntimeError("no free port range found")


@dataclass
class LiveCluster:
    root: Path
    etcd: Any
    group: Any
    addresses: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        try:
            self.group.stop_all(grace=10)
        finally:
            self.etcd.stop()


def engine_flags(s: Settings) -> list[str]:
    return [
        "--threads",
        str(s.threads),
        "--policy",
        "fcfs",
        "--max-running",
        str(s.max_batch),
        "--max-batch-requests",
        str(s.max_batch),
        "--max-prefill-tokens",
        str(s.max_prefill_tokens),
        "--memory-budget",
        s.memory_budget,
        "--block-bytes",
        str(s.block_bytes),
        "--watermark",
        str(s.watermark),
        "--offline",
    ]


def scheduler_flags(s: Settings) -> list[str]:
    """``--no-predict`` where the scheduler has it (unless predictions are asked for): FCFS and
    round-robin ignore predictions, and the profiler round trip is a path cost the simulator has no
    notion of."""
    if s.scheduler_predict:
        return []
    try:
        from llmfleet_scheduler.main import build_parser
    except ImportError:
        return []
    known = {o for a in build_parser()._actions for o in a.option_strings}
    return ["--no-predict"] if "--no-predict" in known else []


def start_cluster(root: Path, s: Settings, log: Any) -> LiveCluster:
    """etcd + the children ``llmfleet up`` plans, with the engine's (and scheduler's) flags appended."""
    import yaml
    from llmfleet.cli.up import plan_services
    from llmfleet.config import ClusterConfig
    from llmfleet.coord import LocalEtcd
    from llmfleet.supervisor import ProcessGroup
    from llmfleet_engine.models import materialize, without_eos

    models_dir = root / "models"
    endless = without_eos(materialize("tiny://llama", models_dir), models_dir / "endless-llama")
    config = {
        "services": {SERVICE: {"model": MODEL, "default_max_tokens": s.output_max}},
        "models": {MODEL: {"source": str(endless)}},
        "engines": {ENGINE_ID: {"models": [MODEL]}},
    }
    config_path = root / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(config))
    etcd = LocalEtcd(root / "etcd").start()
    cluster = LiveCluster(root, etcd, ProcessGroup(root / "logs"))
    try:
        plans = plan_services(
            ClusterConfig.load(config_path),
            config_path,
            etcd=etcd.endpoint,
            state_dir=root,
            base_port=pick_base_port(random.Random(os.getpid() ^ time.monotonic_ns())),
            prefix=f"/fidelity-{uuid.uuid4().hex[:8]}",
            log_level="WARNING",
        )
        for p in plans:
            extra = {ENGINE_ID: engine_flags(s), "scheduler": scheduler_flags(s)}.get(p.name, [])
            cluster.group.spawn(p.name, [*p.argv, *extra], log_path=p.log_path)
            cluster.addresses[p.name] = p.address
        for p in plans:
            cluster.group.wait_healthy(p.name, p.address, timeout=180)
        log(f"cluster healthy: {cluster.addresses}")
    except BaseException:
        cluster.stop()
        raise
    return cluster


async def wait_ready(cluster: LiveCluster, timeout: float = 180) -> Any:
    """Until the engine has loaded the model (placement) and the scheduler routes the service to it;
    the engine's GetInfo."""
    from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
    from llmfleet.client import AsyncClient
    from llmfleet.rpc.channels import open_channel

    deadline = time.monotonic() + timeout
    async with open_channel(cluster.addresses[ENGINE_ID]) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        while True:
            info = await stub.GetInfo(engine_pb2.GetInfoRequest(), timeout=10)
            if any(m.name == MODEL for m in info.models):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine did not load {MODEL}: {info}")
            await asyncio.sleep(0.25)
    async with AsyncClient(cluster.addresses["scheduler"]) as client:
        while True:
            services = {x.name: x for x in await client.list_services(timeout_s=10)}
            if SERVICE in services and services[SERVICE].engines:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler does not route {SERVICE!r}: {services}")
            await asyncio.sleep(0.25)
    return info


async def profile_engine(address: str, s: Settings) -> list[tuple[str, int, int, float]]:
    """The engine's Profile sweep: raw (phase, batch, tokens, seconds) samples."""
    from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
    from llmfleet.rpc.channels import open_channel

    async with open_channel(address) as ch:
        resp = await engine_pb2_grpc.EngineStub(ch).Profile(
            engine_pb2.ProfileRequest(
                model=MODEL,
                batch_sizes=list(s.sweep_batches),
                input_lengths=list(s.sweep_inputs),
                context_lengths=list(s.sweep_contexts),
                repeats=s.sweep_repeats,
            ),
            timeout=600,
        )
    return [(x.phase, x.batch_size, x.tokens, x.seconds) for x in resp.samples]
