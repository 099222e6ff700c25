"""A throwaway local cluster for benchmarks: etcd plus the children ``llmfleet up`` plans for a cluster
config, on a free port range, with per-child extra flags; and a wait until a service is routable."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
from llmfleet.cli.up_plan import CONTROL_PLANE, ENGINE_PORT_OFFSET, plan_services
from llmfleet.client import AsyncClient
from llmfleet.config import ClusterConfig
from llmfleet.coord import LocalEtcd
from llmfleet.rpc.channels import open_channel
from llmfleet.supervisor import ProcessGroup


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port free now on 127.0.0.1 (the system's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_base_port(rng: random.Random | None = None) -> int:
    """A base port with every port ``up`` derives from it (control plane, the first engine) free."""
    rng = rng or random.Random(os.getpid() ^ time.monotonic_ns())
    offsets = [o for *_, o in CONTROL_PLANE] + [ENGINE_PORT_OFFSET]
    for _ in range(200):
        base = rng.randrange(20000, 60000)
        if all(_port_free(base + o) for o in offsets):
            return base
    raise RuntimeError("no free port range found")


@dataclass
class LocalCluster:
    root: Path
    etcd: Any
    group: ProcessGroup
    addresses: dict[str, str] = field(default_factory=dict)
    http: str = ""  # host:port of the scheduler's OpenAI-compatible API ("" when off)

    def stop(self) -> None:
        try:
            self.group.stop_all(grace=10)
        finally:
            self.etcd.stop()


def start_local_cluster(
    config_path: Path,
    root: Path,
    *,
    extra: Mapping[str, Sequence[str]] | None = None,
    prefix: str = "/bench",
    timeout_s: float = 180,
    http_port: int = -1,
    front_workers: int = 0,
) -> LocalCluster:
    """Start etcd under ``root`` and every child ``llmfleet up`` plans for ``config_path`` (with
    ``extra[name]`` appended to that child's flags); returns once every child is healthy.
    ``http_port``: the scheduler's OpenAI-compatible API, -1 off (the default: benchmarks speak gRPC,
    and several clusters must not race for one HTTP port), 0 a free port (``cluster.http`` has it; the
    API may start listening just after the scheduler reports healthy); ``front_workers`` > 0: the
    OpenAI front serves it instead, in that many worker processes."""
    if http_port == 0:
        http_port = free_port()
    etcd = LocalEtcd(root / "etcd").start()
    cluster = LocalCluster(root, etcd, ProcessGroup(root / "logs"))
    try:
        plans = plan_services(
            ClusterConfig.load(config_path),
            config_path,
            etcd=etcd.endpoint,
            state_dir=root,
            base_port=free_base_port(),
            prefix=prefix,
            log_level="WARNING",
            http_port=http_port,
            front_workers=front_workers,
        )
        for p in plans:
            cluster.group.spawn(p.name, [*p.argv, *(extra or {}).get(p.name, [])], log_path=p.log_path)
            cluster.addresses[p.name] = p.address
            cluster.http = cluster.http or p.http
        for p in plans:
            cluster.group.wait_healthy(p.name, p.address, timeout=timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


async def wait_routed(engine: str, scheduler: str, model: str, service: str, timeout_s: float = 180) -> Any:
    """Until the engine at ``engine`` has loaded ``model`` and the scheduler routes ``service`` to an
    engine; returns the engine's ``GetInfo``."""

    deadline = time.monotonic() + timeout_s
    async with open_channel(engine) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        while True:
            info = await stub.GetInfo(engine_pb2.GetInfoRequest(), timeout=10)
            if any(m.name == model for m in info.models):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine did not load {model}: {info}")
            await asyncio.sleep(0.25)
    async with AsyncClient(scheduler) as client:
        while True:
            services = {x.name: x for x in await client.list_services(timeout_s=10)}
            if service in services and services[service].engines:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler does not route {service!r}: {services}")
            await asyncio.sleep(0.25)
