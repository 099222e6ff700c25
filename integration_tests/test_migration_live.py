"""The migration coordinator live: three CPU engines hosting one model, requests spread thinly by
round-robin dispatch; the ``mell`` leader packs them onto fewer engines and deactivates the ones it
empties; the leader is killed after its first migrations and the standby carries on. Every request's
tokens equal transformers' greedy output, and no engine keeps a KV block afterwards."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from harness import Cluster, launch, prepare_endless_llama
from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc, migration_pb2, migration_pb2_grpc
from llmfleet.client import AsyncClient
from util import hf_greedy

PROMPT = "Once upon a time there was a fleet of models"
LONG = 1900
ENGINES = [f"engine-{i}" for i in range(3)]
CONFIG = {
    "services": {"chat": {"model": "tiny-llama", "default_max_tokens": 16}},
    "models": {"tiny-llama": {"source": "{endless}"}},
    "engines": {eid: {"models": ["tiny-llama"]} for eid in ENGINES},
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[int]:
    return hf_greedy(prepare_endless_llama(tmp_path_factory.mktemp("ref")), PROMPT, LONG)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    c = launch(
        tmp_path_factory.mktemp("migration-live"),
        engines=3,
        placement_replicas=1,
        config=CONFIG,
        scheduler_args=("--dispatch", "round_robin"),
        migration_args=("--policy", "mell", "--epoch-s", "0.5"),
        migration_replicas=2,
    )
    try:
        yield c
    finally:
        c.stop()


async def status(address: str) -> migration_pb2.StatusResponse:
    async with grpc.aio.insecure_channel(address) as ch:
        return await migration_pb2_grpc.MigrationStub(ch).Status(migration_pb2.StatusRequest(), timeout=5)


async def leader_status(c: Cluster) -> migration_pb2.StatusResponse | None:
    for name in ("migration-0", "migration-1"):
        if c.procs[name].alive:
            st = await status(c.addresses[name])
            if st.is_leader:
                return st
    return None


async def blocks_used(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        stream = engine_pb2_grpc.EngineStub(ch).WatchLoad(engine_pb2.WatchLoadRequest(interval_s=0.05))
        async for snap in stream:
            stream.cancel()
            return snap.kv_blocks_used
    return -1


async def test_mell_packs_spread_requests_and_survives_a_leader_kill(cluster: Cluster, reference) -> None:
    c = cluster
    deadline = time.monotonic() + 30
    while (await leader_status(c)) is None:
        assert time.monotonic() < deadline, "no migration leader"
        await asyncio.sleep(0.2)
    async with AsyncClient(c.scheduler, timeout_s=300) as client:
        tasks = [asyncio.create_task(client.complete(PROMPT, "chat", max_tokens=LONG)) for _ in range(6)]
        # the leader moves requests together; kill it after its first completed migration
        killed = None
        freed_seen = False
        deadline = time.monotonic() + 120
        while not all(t.done() for t in tasks):
            assert time.monotonic() < deadline, "requests did not finish"
            st = await leader_status(c)
            if st is not None:
                busy = {e.engine_id for e in st.engines if e.load.running + e.load.waiting}
                idle_inactive = [e.engine_id for e in st.engines if not e.active and e.engine_id not in busy]
                if killed is None and any(r.state == "done" for r in st.recent):
                    killed = next(n for n in ("migration-0", "migration-1") if c.procs[n].alive and
                                  (await status(c.addresses[n])).is_leader)  # fmt: skip
                    c.procs.kill(killed)
                if killed is not None and len(busy) < len(ENGINES) and idle_inactive:
                    freed_seen = True
            await asyncio.sleep(0.1)
        results = [t.result() for t in tasks]
    assert killed is not None, "the leader never completed a migration"
    assert freed_seen, "the standby never left an engine empty and inactive"
    survivor = ({"migration-0", "migration-1"} - {killed}).pop()
    st = await status(c.addresses[survivor])
    assert st.is_leader and st.policy == "mell" and st.epochs
    assert len({r.usage.engine_id for r in results}) < len(ENGINES)  # they finished packed together
    for r in results:
        assert list(r.token_ids) == reference, "a migrated request's tokens differ from greedy"
    for eid in ENGINES:  # no KV block leaks on any engine
        deadline = time.monotonic() + 10
        while (n := await blocks_used(c.addresses[eid])) != 0:
            assert time.monotonic() < deadline, f"{eid} still holds {n} KV blocks"
            await asyncio.sleep(0.2)
