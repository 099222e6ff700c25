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
from llmfleet.api.v1 import migration_pb2, migration_pb2_grpc
from llmfleet.client import AsyncClient
from util import hf_greedy, load_snapshot

PROMPT = "Once upon a time there was a fleet of models"
LONG = 1900
SHORT = 60
ENGINES = [f"engine-{i}" for i in range(3)]
CONFIG = {
    "services": {"chat": {"model": "tiny-llama", "max_tokens": 16}},
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


async def blocks_used(address: str) -> int:
    return (await load_snapshot(address)).kv_blocks_used


async def wait_leader(c: Cluster, not_: str = "") -> tuple[str, migration_pb2.StatusResponse]:
    deadline = time.monotonic() + 30
    while True:
        for name in ("migration-0", "migration-1"):
            if name != not_ and c.procs[name].alive:
                st = await status(c.addresses[name])
                if st.is_leader:
                    return name, st
        assert time.monotonic() < deadline, "no migration leader"
        await asyncio.sleep(0.2)


async def packed_round(c: Cluster, client: AsyncClient, leader: str) -> tuple[list, bool]:
    """Round robin gives each engine one long and one short request; as the short ones depart, Mell
    refills their engines from the most recently activated one, which is left empty and inactive."""
    tasks = [asyncio.create_task(client.complete(PROMPT, "chat", max_tokens=LONG)) for _ in range(3)]
    tasks += [asyncio.create_task(client.complete(PROMPT, "chat", max_tokens=SHORT)) for _ in range(3)]
    freed = False
    deadline = time.monotonic() + 120
    while not all(t.done() for t in tasks):
        assert time.monotonic() < deadline, "requests did not finish"
        st = await status(c.addresses[leader])
        busy = {e.engine_id for e in st.engines if e.load.running + e.load.waiting}
        done = [r for r in st.recent if r.state == "done"]
        if (
            done
            and busy
            and len(busy) < len(ENGINES)
            and any(not e.active for e in st.engines if e.engine_id not in busy)
        ):
            freed = True
        await asyncio.sleep(0.05)
    return [t.result() for t in tasks], freed


async def test_mell_packs_spread_requests_and_survives_a_leader_kill(cluster: Cluster, reference) -> None:
    c = cluster
    leader, _ = await wait_leader(c)
    async with AsyncClient(c.scheduler, timeout_s=300) as client:
        first, freed = await packed_round(c, client, leader)
        assert freed, "the leader never left an engine empty and inactive while requests ran"
        c.procs.kill(leader)  # mid-epoch: its loop ticks every 0.5 s
        standby, st = await wait_leader(c, not_=leader)
        assert st.policy == "mell"
        second, freed = await packed_round(c, client, standby)
        assert freed, "the standby did not pack"
    st = await status(c.addresses[standby])
    assert st.epochs and st.epochs[-1].epoch > 1 and all(r.state != "failed" for r in st.recent)
    for r in first + second:
        n = len(r.token_ids)
        assert n in (LONG, SHORT) and list(r.token_ids) == reference[:n], "a migrated request's tokens differ"
    for eid in ENGINES:  # no KV block leaks on any engine
        deadline = time.monotonic() + 10
        while (n := await blocks_used(c.addresses[eid])) != 0:
            assert time.monotonic() < deadline, f"{eid} still holds {n} KV blocks"
            await asyncio.sleep(0.2)
