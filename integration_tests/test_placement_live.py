"""The live placement loop on a real cluster: 4 CPU engines, two services, the ``aladdin`` planner.

Chat's load rises → within a few intervals the leader gives it a second engine; the leader is killed
right after writing that plan → the standby adopts the plan in etcd and the engines finish the
replacement; the load falls → one chat engine is drained (its requests finish or move) and released
(idle). Every request completes with exactly the greedy reference's tokens.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import grpc
import pytest
import yaml
from harness import TTL_S, Cluster, prepare_endless_llama
from llmfleet.api.v1 import placement_pb2, placement_pb2_grpc
from llmfleet.client import AsyncClient
from llmfleet.config import EtcdSettings
from llmfleet.coord import EtcdClient, LocalEtcd, node_view, placement_view
from llmfleet.coord.desired import get_placement_meta
from llmfleet.supervisor import ProcessGroup
from llmfleet.types import ENGINE_ROLE
from util import hf_greedy

PROMPT = "Once upon a time there was a fleet of models"
ENGINES = [f"engine-{i}" for i in range(4)]
LONG = 2000  # tokens of the requests that run through the scale-in
INTERVAL_S = 1.0
# chat's workers: max(1, ⌈0.5·rate⌉): 1 at rest, 2 under the ~3 req/s load below
PLACEMENT = {
    "policy": "aladdin",
    "interval_s": INTERVAL_S,
    "options": {"k5": 0.5, "c5": 0.0, "min_workers": 1, "t_dec": 0.2},
    "window_s": 10.0,
}


def launch_live(root: Path) -> Cluster:
    """etcd, a scheduler, two placement replicas and four idle engines (the planner places models)."""
    models_dir = root / "models"
    endless = prepare_endless_llama(models_dir)
    config = {
        "services": {
            "chat": {"model": "tiny-llama", "slo": {"ttft_s": 2.0, "tpot_s": 0.2}, "max_tokens": 16},
            "summarize": {"model": "tiny-qwen2", "max_tokens": 8},
        },
        "models": {"tiny-llama": {"source": str(endless)}, "tiny-qwen2": {"source": "tiny://qwen2"}},
        "engines": {eid: {} for eid in ENGINES},
        "placement": PLACEMENT,
    }
    config_path = root / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(config))
    etcd = LocalEtcd(root / "etcd").start()
    c = Cluster(
        root, etcd, ProcessGroup(root / "logs"), f"/it-{uuid.uuid4().hex[:8]}", config_path, models_dir
    )
    try:
        c.start("scheduler", "llmfleet-scheduler", "--orphan-grace-s", "0.5", "--stats-interval-s", "0.5")
        for i in range(2):
            c.start(f"placement-{i}", "llmfleet-placement", "--config", str(config_path), "--resync-s", "1")
        for eid in ENGINES:
            c.start(
                eid,
                "llmfleet-engine",
                "--models-dir", str(models_dir), "--threads", "1", "--offline",
                "--memory-budget", "256MiB", "--drain-timeout-s", "0.2",
            )  # fmt: skip
        c.wait_healthy()
    except BaseException:
        c.stop()
        raise
    return c


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Cluster:
    c = launch_live(tmp_path_factory.mktemp("placement-live"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[int]:
    """The endless llama's greedy continuation by transformers (before the cluster competes for CPU)."""
    models = tmp_path_factory.mktemp("reference")
    return hf_greedy(prepare_endless_llama(models), PROMPT, LONG)


class Fleet:
    """The test's own etcd views: which engine hosts (advertises) what, and the plan in force."""

    def __init__(self, c: Cluster) -> None:
        self.client = EtcdClient(
            EtcdSettings(endpoints=[c.etcd.endpoint], prefix=c.prefix, lease_ttl_s=TTL_S)
        )
        self.nodes = node_view(self.client)
        self.placements = placement_view(self.client)

    async def __aenter__(self) -> Fleet:
        await self.client.connect()
        for v in (self.nodes, self.placements):
            await v.start()
        return self

    async def __aexit__(self, *exc) -> None:
        for v in (self.nodes, self.placements):
            await v.stop()
        await self.client.close()

    def hosts(self, model: str) -> list[str]:
        return sorted(
            n.node_id for n in self.nodes.snapshot().values() if n.role == ENGINE_ROLE and model in n.models
        )

    def idle(self) -> list[str]:
        return sorted(
            n.node_id for n in self.nodes.snapshot().values() if n.role == ENGINE_ROLE and not n.models
        )

    async def until(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what}; nodes: "
                    f"{ {k: n.models for k, n in self.nodes.snapshot().items()} }"
                )
            await asyncio.sleep(0.1)

    async def leader(self) -> str:
        raw = await self.client.get(self.client.keys.leader("placement"))
        return raw.decode() if raw else ""


class Load:
    """Open-loop requests in the background; every result is kept to be checked."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.tasks: list[asyncio.Task] = []
        self.results: list[tuple[int, tuple[int, ...]]] = []

    async def one(self, service: str, max_tokens: int) -> None:
        out = await self.client.complete(PROMPT, service=service, max_tokens=max_tokens)
        self.results.append((max_tokens, out.token_ids) if service == "chat" else (-1, out.token_ids))

    async def run(
        self, rate: float, stop: asyncio.Event, service: str = "chat", max_tokens: int = 16
    ) -> None:
        while not stop.is_set():
            self.tasks.append(asyncio.create_task(self.one(service, max_tokens)))
            await asyncio.sleep(1 / rate)

    async def finish(self) -> None:
        await asyncio.gather(*self.tasks)


async def get_plan(address: str) -> placement_pb2.PlacementPlan:
    async with grpc.aio.insecure_channel(address) as ch:
        return await placement_pb2_grpc.PlacementStub(ch).GetPlan(placement_pb2.GetPlanRequest(), timeout=5)


async def wait_decision(address: str, predicate, timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while not any(predicate(d.summary) for d in (await get_plan(address)).decisions):
        assert time.monotonic() < deadline, "the leader did not propose to release an engine"
        await asyncio.sleep(0.1)


async def test_scale_out_failover_and_scale_in_lose_nothing(reference: list[int], live: Cluster):
    async with Fleet(live) as fleet, AsyncClient(live.scheduler, timeout_s=120) as client:
        # the first plan: one engine per model (rate 0 → min_workers), the other two idle
        await fleet.until(
            lambda: len(fleet.hosts("tiny-llama")) == 1 and len(fleet.hosts("tiny-qwen2")) == 1
            and len(fleet.idle()) == 2,
            90, "the first plan to be loaded",
        )  # fmt: skip
        first = await get_placement_meta(fleet.client)
        assert first is not None and first.policy == "aladdin"
        load = Load(client)
        await load.one("summarize", 8)

        # chat's load rises: a second engine gets tiny-llama; kill the leader as soon as it writes that
        stop = asyncio.Event()
        gen = asyncio.create_task(load.run(3.0, stop))
        old = await fleet.leader()
        await fleet.until(
            lambda: sum("tiny-llama" in [m.name for m in p.models] for p in fleet.placements.snapshot().values()) == 2,
            60, "the leader to give chat a second engine",
        )  # fmt: skip
        scale_out = await get_placement_meta(fleet.client)
        live.procs.kill(old)
        standby = ({"placement-0", "placement-1"} - {old}).pop()
        await fleet.until(
            lambda: len(fleet.hosts("tiny-llama")) == 2, 60, "the engines to finish the scale-out"
        )
        deadline = time.monotonic() + 3 * TTL_S + 10
        while await fleet.leader() != standby:
            assert time.monotonic() < deadline, "the standby did not take placement leadership"
            await asyncio.sleep(0.2)
        plan = await get_plan(live.addresses[standby])
        adopted = [d.summary for d in plan.decisions if d.summary.startswith("adopted")]
        assert adopted and adopted[0].startswith(f"adopted plan #{scale_out.plan_id} (aladdin, by {old})")

        # the load falls: as soon as the leader proposes to release an engine, two long requests start
        # (one per chat engine): the one on the engine being released is drained (after 0.2 s: moved)
        stop.set()
        await gen
        await wait_decision(
            live.addresses[standby], lambda d: d.startswith("proposed") and "-tiny-llama" in d
        )
        for _ in range(2):
            load.tasks.append(asyncio.create_task(load.one("chat", LONG)))
        await fleet.until(
            lambda: len(fleet.hosts("tiny-llama")) == 1 and len(fleet.idle()) == 2,
            40,
            "chat to scale back in",
        )
        await load.finish()
        final = await get_placement_meta(fleet.client)
        assert final.plan_id > scale_out.plan_id and final.leader == standby
        assert "(idle)" in final.summary and "GPUs 3 -> 2" in final.summary

    chat = [(n, ids) for n, ids in load.results if n > 0]
    assert len(chat) >= 10 and len(load.results) == len(load.tasks) + 1
    for n, ids in chat:
        assert list(ids) == reference[:n]
    deadline = time.monotonic() + 10
    while not any("drained and unloaded tiny-llama" in live.log(e) for e in ENGINES):
        assert time.monotonic() < deadline, "no engine logged its drain"
        await asyncio.sleep(0.1)
