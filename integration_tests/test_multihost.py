"""A cluster spanning "hosts": Linux network namespaces on one bridge (``netns.py``), every process
binding and advertising its own address.

    root namespace (bridge 10.213.X.1): etcd, scheduler, profiler, placement, this test
    host-a (10.213.X.10):               engine-0, scheduler-1 (a second scheduler replica)
    host-b (10.213.X.11):               engine-1

Both engines host the same model. Requests through either scheduler complete on both engines; then
host-b is cut off (its bridge port down: packets dropped, nothing reset): engine-1's lease expires
within the TTL, requests keep completing through both schedulers, and the ones engine-1 was serving
fail over to engine-0 and finish with every token; healed, engine-1 re-registers with a new lease and
serves again. Skipped where network namespaces cannot be created (not root, no CAP_NET_ADMIN, no
iproute2)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from harness import BIN, TTL_S, Cluster, prepare_endless_llama
from llmfleet.client import AsyncClient
from llmfleet.config import ClusterConfig
from llmfleet.coord import LocalEtcd
from llmfleet.supervisor import ProcessGroup, free_port
from netns import Hosts, clean_stale, netns_pids, netns_unavailable

pytestmark = pytest.mark.skipif(
    netns_unavailable() is not None, reason=f"network namespaces unavailable: {netns_unavailable()}"
)

ENGINE_PORT = 50061  # inside a namespace every port is free
SCHEDULER_PORT = 50051
N = 1000  # tokens of the long requests that are in flight when host-b is cut (~1.5 s alone on a CPU)
PROMPT = "A fleet that spans hosts"
SHORT = 16

CONFIG = {
    "services": {"chat": {"model": "llama", "slo": {"ttft_s": 5.0, "tpot_s": 0.5}, "max_tokens": SHORT}},
    "models": {"llama": {"source": "{endless}"}},
    "engines": {"engine-0": {"models": ["llama"]}, "engine-1": {"models": ["llama"]}},
}
WHERE = {"engine-0": "host-a", "scheduler-1": "host-a", "engine-1": "host-b"}


class MultiHost:
    """The namespaces and the cluster in them; ``close()`` is idempotent."""

    def __init__(self, root: Path) -> None:
        self.hosts = Hosts.create(["host-a", "host-b"])
        self.cluster: Cluster | None = None
        self.timings: dict[str, float] = {}
        try:
            self._launch(root)
        except BaseException:
            self.close()
            raise

    def _launch(self, root: Path) -> None:
        models_dir = root / "models"
        endless = prepare_endless_llama(models_dir)
        config = json.loads(json.dumps(CONFIG).replace("{endless}", str(endless)))
        engines = ClusterConfig.model_validate(config).engines
        config_path = root / "cluster.yaml"
        config_path.write_text(yaml.safe_dump(config))
        etcd = LocalEtcd(root / "etcd", host=self.hosts.gateway).start()
        c = self.cluster = Cluster(
            root, etcd, ProcessGroup(root / "logs"), f"/mh-{uuid.uuid4().hex[:8]}", config_path, models_dir
        )
        sched = ("--orphan-grace-s", "0.5", "--http-port", "-1")
        self.spawn("scheduler", "llmfleet-scheduler", *sched)
        self.spawn("profiler", "llmfleet-profiler")
        self.spawn("placement", "llmfleet-placement", "--config", str(config_path), "--resync-s", "1")
        for eid in config["engines"]:
            self.spawn(
                eid, "llmfleet-engine", "--models-dir", str(models_dir), "--threads", "1", "--offline",
                *engines[eid].engine_args(),
            )  # fmt: skip
        self.spawn("scheduler-1", "llmfleet-scheduler", *sched)
        c.wait_healthy(timeout=120)
        want = {eid: set(e["models"]) for eid, e in config["engines"].items()}
        c.wait_status(
            lambda s: {n["node_id"]: set(n["models"]) for n in s["nodes"] if n["role"] == "engine"} == want,
            timeout=120,
            what="engines to load their placement",
        )

    def spawn(self, name: str, script: str, *extra: str) -> None:
        """``script`` in its host's namespace (the root namespace's bridge address when it has none),
        binding and advertising that host's address; etcd at the bridge."""
        c = self.cluster
        assert c is not None
        host = WHERE.get(name)
        if host is None:
            addr, port = self.hosts.gateway, free_port(self.hosts.gateway)
        else:
            addr, port = self.hosts.address(host), ENGINE_PORT if "engine" in name else SCHEDULER_PORT
        argv = [
            str(BIN / script), *c.common(), "--host", addr, "--port", str(port),
            "--advertise", f"{addr}:{port}", "--id", name, *extra,
        ]  # fmt: skip
        c.addresses[name] = f"{addr}:{port}"
        c.procs.spawn(
            name, self.hosts.wrap(host, argv) if host else argv, log_path=c.root / "logs" / f"{name}.log"
        )

    # -- etcd, read directly (etcdctl answers in milliseconds; `llmfleet status` takes a second) ------
    def node_lease(self, node_id: str) -> int | None:
        """The lease of ``nodes/<node_id>``, None when the key is gone."""
        c = self.cluster
        assert c is not None
        out = json.loads(c.etcd.ctl("get", f"{c.prefix}/nodes/{node_id}", "-w", "json"))
        kvs = out.get("kvs") or []
        return int(kvs[0]["lease"]) if kvs else None

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        self.hosts.close()


@pytest.fixture(scope="module")
def mh(tmp_path_factory):
    m = MultiHost(tmp_path_factory.mktemp("multihost"))
    try:
        yield m
    finally:
        m.close()


def _scheduler(mh: MultiHost, name: str) -> str:
    assert mh.cluster is not None
    return mh.cluster.addresses[name]


async def _complete_all(client: AsyncClient, n: int, max_tokens: int = SHORT, prompt: str = PROMPT):
    return await asyncio.gather(
        *(client.complete(f"{prompt} {i}", service="chat", max_tokens=max_tokens) for i in range(n))
    )


def test_each_process_registers_its_namespace_address(mh: MultiHost):
    c = mh.cluster
    assert c is not None
    nodes = {n["node_id"]: n for n in c.status()["nodes"]}
    for name, host in WHERE.items():
        assert (
            nodes[name]["address"]
            == f"{mh.hosts.address(host)}:{ENGINE_PORT if 'engine' in name else SCHEDULER_PORT}"
        )
    for name in ("scheduler", "profiler", "placement"):
        assert nodes[name]["address"].startswith(f"{mh.hosts.gateway}:"), nodes[name]
    # each namespaced process really runs in its namespace, and nothing else of ours does
    for host in ("host-a", "host-b"):
        inside = {c.procs[name].pid for name, h in WHERE.items() if h == host}
        assert set(netns_pids(mh.hosts.hosts[host].netns)) == inside, host


async def test_requests_through_both_schedulers_complete_on_both_engines(mh: MultiHost):
    served: dict[str, set[str]] = {}
    for name in ("scheduler", "scheduler-1"):
        async with AsyncClient(_scheduler(mh, name), timeout_s=60) as client:
            done = await _complete_all(client, 8)
        assert all(len(r.token_ids) == SHORT and r.usage.finish_reason == "length" for r in done)
        served[name] = {r.usage.engine_id for r in done}
    assert served["scheduler"] | served["scheduler-1"] == {"engine-0", "engine-1"}, served


async def test_partition_a_host_then_heal_it(mh: MultiHost):
    c = mh.cluster
    assert c is not None
    both = f"{_scheduler(mh, 'scheduler')},{_scheduler(mh, 'scheduler-1')}"  # the replicas, one client
    async with (
        AsyncClient(_scheduler(mh, "scheduler"), timeout_s=90, retries=5) as root_client,
        AsyncClient(_scheduler(mh, "scheduler-1"), timeout_s=90, retries=5) as a_client,
        AsyncClient(both, timeout_s=90, retries=5) as both_client,
    ):
        t0 = time.monotonic()
        reference = await root_client.complete(PROMPT, service="chat", max_tokens=N)  # uninterrupted, greedy
        want = reference.token_ids
        mh.timings["reference_s"] = time.monotonic() - t0
        assert len(want) == N
        lease_before = mh.node_lease("engine-1")
        assert lease_before is not None

        # long requests, half through each scheduler, all mid-stream when host-b is cut
        clients = [root_client, a_client] * 3
        streams = [cl.generate(PROMPT, service="chat", max_tokens=N, temperature=0.0) for cl in clients]
        got: list[list[int]] = [[] for _ in streams]

        async def read(i: int, until: int | None) -> None:
            async for chunk in streams[i]:
                got[i].extend(chunk.token_ids)
                if until is not None and len(got[i]) >= until:
                    return

        await asyncio.gather(*(read(i, 4) for i in range(len(streams))))
        on_b = [i for i, s in enumerate(streams) if s.engine_id == "engine-1"]
        assert on_b, f"no long request went to engine-1: {[s.engine_id for s in streams]}"

        mh.hosts.partition("host-b")
        cut = time.monotonic()
        rest = asyncio.gather(*(read(i, None) for i in range(len(streams))))

        # engine-1's lease expires within the TTL (+ etcd's expiry check)
        while mh.node_lease("engine-1") is not None:
            assert time.monotonic() - cut < TTL_S + 5, "engine-1 still registered"
            await asyncio.sleep(0.05)
        mh.timings["partition_to_lease_gone_s"] = time.monotonic() - cut
        assert mh.node_lease("engine-0") is not None  # host-a is not affected

        # both schedulers keep serving, on engine-0 (the scheduler in host-a included)
        during = []
        for client in (root_client, a_client, both_client):
            t0 = time.monotonic()
            done = await _complete_all(client, 4)
            assert [len(r.token_ids) for r in done] == [SHORT] * 4
            assert {r.usage.engine_id for r in done} == {"engine-0"}
            assert time.monotonic() - t0 < 30, "requests during the partition waited for the lost engine"
            during += [r.request_id for r in done]
        mh.timings["partition_to_short_requests_done_s"] = time.monotonic() - cut

        # every long request completes with all its tokens, exactly once, greedy = uninterrupted
        await asyncio.wait_for(rest, timeout=75)
        mh.timings["partition_to_inflight_done_s"] = time.monotonic() - cut
        for i, s in enumerate(streams):
            assert got[i] == list(want), f"stream {i} ({s.engine_id}): {len(got[i])} tokens"
            assert s.finish_reason == "length"
        assert {streams[i].usage.engine_id for i in on_b} == {"engine-0"}  # resumed off the cut host
        failovers = _failovers(c)
        assert {streams[i].request_id for i in on_b} <= failovers  # ... by the relay, after engine-1 failed
        assert not failovers & set(during)  # once engine-1 had left, nothing was sent to it

        # heal: engine-1 registers again with a new lease and serves again
        mh.hosts.heal("host-b")
        healed = time.monotonic()
        while (lease := mh.node_lease("engine-1")) is None:
            assert time.monotonic() - healed < 30, "engine-1 did not re-register"
            await asyncio.sleep(0.05)
        mh.timings["heal_to_registered_s"] = time.monotonic() - healed
        assert lease != lease_before
        node = next(n for n in c.status()["nodes"] if n["node_id"] == "engine-1")
        assert node["address"] == f"{mh.hosts.address('host-b')}:{ENGINE_PORT}", node
        assert node["models"] == ["llama"], node

        served: set[str] = set()
        while "engine-1" not in served:
            assert time.monotonic() - healed < 40, f"engine-1 serves nothing after the heal ({served})"
            for client in (root_client, a_client):
                done = await _complete_all(client, 4)
                assert [len(r.token_ids) for r in done] == [SHORT] * 4
                served |= {r.usage.engine_id for r in done}
        mh.timings["heal_to_serving_s"] = time.monotonic() - healed
    print(f"\nmultihost timings: {json.dumps({k: round(v, 2) for k, v in mh.timings.items()})}")


def _failovers(c: Cluster) -> set[str]:
    """Ids of the requests a scheduler relay moved off a failed engine (from both replicas' logs)."""
    out = set()
    for name in ("scheduler", "scheduler-1"):
        for line in c.log(name).splitlines():
            if "failing over" in line and (m := re.search(r"request (\S+): engine engine-1 failed", line)):
                out.add(m.group(1))
    return out


def test_stale_namespaces_of_a_dead_run_are_cleaned():
    """A run killed with SIGKILL leaves its namespaces and bridge; the next run removes them."""
    code = (
        "import os, signal, sys; sys.path.insert(0, sys.argv[1]); from netns import Hosts; "
        "h = Hosts.create(['x']); print(h.hosts['x'].netns, h.bridge, flush=True); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == -signal.SIGKILL, out.stderr
    ns, bridge = out.stdout.split()
    assert ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    removed = clean_stale()
    assert ns in removed and bridge in removed
    assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0


def test_teardown_leaves_nothing_behind(mh: MultiHost):
    c = mh.cluster
    assert c is not None
    pids = [child.pid for child in c.procs.children]
    mh.close()
    assert mh.hosts.leftovers() == []
    assert not c.etcd.running
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    mh.close()  # idempotent
