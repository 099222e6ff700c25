"""The chaos suite's local cluster: what ``llmfleet up`` plans, plus a standby placement and migration
replica, engines hosting the tiny llama without EOS; start, stop, kill and restart its processes, and
tell when it is whole again (every process registered, leaders elected, both schedulers routing)."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfleet.cli.local_cluster import free_base_port
from llmfleet.cli.status import EtcdStatusSource, collect_status
from llmfleet.cli.up import plan_services
from llmfleet.client import AsyncClient
from llmfleet.config import ClusterConfig, EtcdSettings
from llmfleet.coord import LocalEtcd
from llmfleet.coord.client import EtcdClient
from llmfleet.ports import free_port
from llmfleet.supervisor import ProcessGroup, describe_returncode
from llmfleet_engine.models import materialize, without_eos

from tools.toolkit.procs import tree_pids, tree_rss_kib

log = logging.getLogger("chaos")

SERVICE = "chat"
MODEL = "tiny-llama"


def _free_port_pair() -> int:
    """A port p with p and p + 1 free (``up`` puts scheduler-1's HTTP API on the scheduler's + 1)."""
    for _ in range(200):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no pair of free ports found")


def _retarget(argv: list[str], node_id: str, port: int) -> list[str]:
    """A replica's command line: ``argv`` with another ``--id``, ``--port`` and ``--metrics-port``."""
    out = list(argv)
    for flag, value in (("--id", node_id), ("--port", str(port)), ("--metrics-port", str(free_port()))):
        i = out.index(flag)
        out[i + 1] = value
    return out


@dataclass
class Node:
    name: str
    argv: list[str]
    address: str
    log_path: Path
    http: str = ""


class ChaosCluster:
    """etcd + the children ``up`` plans (two scheduler replicas with HTTP, or the OpenAI front with
    ``front_workers``), standby placement and migration replicas, ``engines`` engines hosting the
    endless tiny llama (static placement)."""

    def __init__(
        self,
        root: Path,
        *,
        engines: int = 2,
        ttl: int = 10,
        engine_threads: int = 1,
        scheduler_args: Sequence[str] = (),
        engine_args: Sequence[str] = (),
        max_tokens: int = 16,  # the service's output cap for a request that sets none
        front_workers: int = 0,  # > 0: the OpenAI front serves HTTP (that many workers), not the schedulers
    ) -> None:
        import yaml

        self.root = root
        self.ttl = ttl
        self.prefix = f"/chaos-{uuid.uuid4().hex[:8]}"
        models_dir = root / "models"
        endless = without_eos(materialize("tiny://llama", models_dir), models_dir / "endless-llama")
        self.engine_ids = [f"engine-{i}" for i in range(engines)]
        config = {
            "services": {SERVICE: {"model": MODEL, "max_tokens": max_tokens}},
            "models": {MODEL: {"source": str(endless)}},
            "placement": {"policy": "static"},
            "engines": {e: {"models": [MODEL]} for e in self.engine_ids},
        }
        self.config_path = root / "cluster.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.etcd = LocalEtcd(root / "etcd")
        self.group = ProcessGroup(root / "logs")
        plans = plan_services(
            ClusterConfig.load(self.config_path),
            self.config_path,
            etcd="",  # filled in at start()
            state_dir=root,
            base_port=free_base_port(),
            prefix=self.prefix,
            ttl=ttl,
            log_level="WARNING",
            http_port=_free_port_pair(),
            schedulers=2,
            front_workers=front_workers,
        )
        self.nodes: dict[str, Node] = {}
        for p in plans:
            argv = list(p.argv)
            if p.name.startswith("scheduler"):
                argv += [*scheduler_args]
            if p.name in self.engine_ids:
                argv += ["--threads", str(engine_threads), "--offline", *engine_args]
            self.nodes[p.name] = Node(p.name, argv, p.address, p.log_path, p.http)
            if p.name in ("placement", "migration"):  # a standby replica: leader kills test the election
                port = free_port()
                name = f"{p.name}-1"
                self.nodes[name] = Node(
                    name,
                    _retarget(argv, name, port),
                    f"127.0.0.1:{port}",
                    p.log_path.with_name(f"{name}.log"),
                )
        self.schedulers = [n for n in self.nodes if n.startswith("scheduler")]
        self.unexpected_exits: list[str] = []

    # addresses
    @property
    def sdk_addresses(self) -> list[str]:
        return [self.nodes[s].address for s in self.schedulers]

    @property
    def http_addresses(self) -> list[str]:
        """Where the OpenAI API is served: the front's one address, else each scheduler's."""
        front = self.nodes.get("front")
        return [front.http] if front is not None else [self.nodes[s].http for s in self.schedulers]

    def start(self, timeout_s: float = 240) -> None:
        self.etcd.start()
        for node in self.nodes.values():
            i = node.argv.index("--etcd")
            node.argv[i + 1] = self.etcd.endpoint
            self.group.spawn(node.name, node.argv, log_path=node.log_path)
        for node in self.nodes.values():
            self.group.wait_healthy(node.name, node.address, timeout=timeout_s)

    def stop(self) -> None:
        for node in self.nodes.values():  # a frozen child would ignore SIGTERM for the whole grace
            if node.name in self.group and self.group[node.name].alive:
                self.group[node.name].signal(signal.SIGCONT)
        try:
            self.group.stop_all(grace=10, together=True)
        finally:
            self.etcd.stop()

    def pids(self) -> dict[str, int]:
        """The pid of every live process (etcd included)."""
        out = {c.name: c.pid for c in self.group.children if c.alive}
        if self.etcd.pid is not None:
            out["etcd"] = self.etcd.pid
        return out

    def rss_kib(self) -> dict[str, int]:
        """Resident memory of each process (its descendants included), KiB."""
        out = {}
        for name, pid in self.pids().items():
            if (rss := tree_rss_kib(pid)) is not None:
                out[name] = rss
        return out

    # -- the state etcd and the schedulers report --------------------------------------------------------
    async def leader(self, role: str, timeout_s: float = 30.0) -> tuple[str | None, str]:
        """The process holding ``leaders/<role>`` (None if none within ``timeout_s``) and, when none,
        why: etcd's answer is asked again until then, since a busy host can time out one read or a
        campaign can be between two leases."""
        deadline = time.monotonic() + timeout_s
        why = ""
        while True:
            try:
                status = await self.etcd_status(timeout_s=3.0)
                leader = next((r.leader for r in status.leaders if r.role == role), None)
                if leader is not None:
                    return leader, ""
                why = f"leaders: {sorted(r.role for r in status.leaders)}"
            except Exception as e:
                why = f"etcd: {type(e).__name__}: {e}"
            if time.monotonic() >= deadline:
                return None, why
            await asyncio.sleep(0.5)

    async def etcd_status(self, timeout_s: float = 2.0) -> Any:
        """What etcd says (nodes with their leases, leaders): ``llmfleet status`` without asking the
        placement and migration leaders, so a frozen process cannot stall the check."""

        settings = EtcdSettings.from_env(endpoints=self.etcd.endpoint, prefix=self.prefix)
        settings.timeout_s = timeout_s
        client = EtcdClient(settings)
        try:
            await asyncio.wait_for(client.connect(wait=False), timeout_s)
            return await asyncio.wait_for(
                collect_status(EtcdStatusSource(client), client.keys), 2 * timeout_s
            )
        finally:
            await client.close()

    async def whole(self) -> tuple[bool, str]:
        """(True, "") when every process is registered with a live lease, placement and migration have
        a leader and both schedulers route the service to every engine; else (False, what is missing)."""
        import httpx

        try:
            status = await self.etcd_status()
        except Exception as e:
            return False, f"etcd: {type(e).__name__}"
        pids = self.pids()
        live = {  # a live lease held by the process running now (not one a killed process left behind)
            n.node_id
            for n in status.nodes
            if n.lease_ttl_s is not None
            and n.lease_ttl_s > 0
            and n.node_id in pids
            and (not n.pid or n.pid in tree_pids(pids[n.node_id]))
        }
        missing = sorted(set(self.nodes) - live)
        if missing:
            seen = {n.node_id: f"pid {n.pid} ttl {n.lease_ttl_s}" for n in status.nodes}
            detail = ", ".join(f"{m} ({seen.get(m, 'absent')}; running pid {pids.get(m)})" for m in missing)
            return False, f"not registered: {detail}"
        roles = {r.role for r in status.leaders}
        if not {"placement", "migration"} <= roles:
            return False, f"leaders: {sorted(roles)}"
        for name in self.schedulers:
            try:
                async with AsyncClient(self.nodes[name].address, timeout_s=2, retries=0) as c:
                    services = {s.name: s for s in await c.list_services()}
            except Exception as e:
                return False, f"{name}: {type(e).__name__}"
            if SERVICE not in services or set(services[SERVICE].engines) != set(self.engine_ids):
                got = services[SERVICE].engines if SERVICE in services else None
                return False, f"{name} routes {SERVICE} to {got}"
        for http in self.http_addresses:  # the schedulers' own APIs, or the front's
            try:
                async with httpx.AsyncClient(timeout=2) as h:
                    r = await h.get(f"http://{http}/health")
                if r.status_code != 200:
                    return False, f"http {http} /health {r.status_code}"
            except Exception as e:
                return False, f"http {http}: {type(e).__name__}"
        return True, ""

    def restart_exited(self) -> list[str]:
        """What ``llmfleet up``'s supervisor does: start again every child that exited (none of ours
        is meant to); returns ``"name (pid P, exit): log tail"`` for each, and keeps them in
        ``self.unexpected_exits``."""

        out = []
        for child in self.group.poll_exited():
            if child.name not in self.nodes or self.group[child.name] is not child:
                continue  # an old incarnation we killed ourselves
            note = f"{child.name} (pid {child.pid}, {describe_returncode(child.returncode)})"
            log.warning("%s exited unexpectedly; restarting it. Log tail:\n%s", note, child.log_tail(10))
            self.unexpected_exits.append(note)
            out.append(note)
            self.group.respawn(child.name)
        return out

    async def wait_whole(self, timeout_s: float, interval_s: float = 0.2) -> tuple[float | None, str]:
        """Seconds until whole (None on timeout) and the last thing missing; a child that exited
        meanwhile is restarted (and reported, see :meth:`restart_exited`)."""
        t0 = time.monotonic()
        why = ""
        while time.monotonic() - t0 < timeout_s:
            self.restart_exited()
            ok, why = await self.whole()
            if ok:
                return time.monotonic() - t0, ""
            await asyncio.sleep(interval_s)
        return None, why

    async def wait_routed(self, timeout_s: float = 240) -> None:
        took, why = await self.wait_whole(timeout_s)
        if took is None:
            raise TimeoutError(f"the cluster did not become whole in {timeout_s}s: {why}")

    async def respawn(self, name: str) -> None:
        self.group.respawn(name)

    def signal(self, name: str, sig: int) -> None:
        self.group[name].signal(sig)
