"""End to end on a real multi-process cluster (see harness.launch). Destructive tests come last."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from harness import TTL_S, Cluster
from llmfleet.api.v1 import (
    engine_pb2,
    engine_pb2_grpc,
    placement_pb2,
    placement_pb2_grpc,
    profiler_pb2,
    profiler_pb2_grpc,
)
from llmfleet.client import AsyncClient
from llmfleet.client.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from llmfleet.config import EtcdSettings
from llmfleet.coord import EtcdClient, LocalEtcd
from util import flatten, hf_greedy, migration_status, wait_running

PROMPT = "Once upon a time there was a fleet of models"
# Requests that must still be running when the coordinator's view is polled (every 0.1 s) after the
# client read a few tokens: on a fast engine a few hundred tokens are done before that.
LONG_TOKENS = 1500

EXPECTED_SERVICES = {
    "scheduler": "llmfleet.v1.Scheduler",
    "profiler": "llmfleet.v1.Profiler",
    "placement-0": "llmfleet.v1.Placement",
    "migration": "llmfleet.v1.Migration",
    "engine-0": "llmfleet.v1.Engine",
}


def etcd_client(c: Cluster) -> EtcdClient:
    return EtcdClient(EtcdSettings(endpoints=[c.etcd.endpoint], prefix=c.prefix, lease_ttl_s=TTL_S))


def test_etcdctl_shows_node_keys_bound_to_leases(cluster: Cluster):
    out = subprocess.run(
        [
            str(LocalEtcd.etcdctl_path()),
            "--endpoints",
            cluster.etcd.endpoint,
            "get",
            "--prefix",
            f"{cluster.prefix}/nodes/",
            "-w",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=20,
    )
    kvs = json.loads(out.stdout)["kvs"]
    assert len(kvs) == len(cluster.addresses)
    assert all(kv.get("lease", 0) != 0 for kv in kvs), kvs


@pytest.mark.parametrize("name", sorted(EXPECTED_SERVICES))
def test_reflection_lists_every_service(cluster: Cluster, name: str):
    with grpc.insecure_channel(cluster.addresses[name]) as ch:
        services = set(ProtoReflectionDescriptorDatabase(ch).get_services())
    assert {
        EXPECTED_SERVICES[name],
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= services


async def test_stream_matches_transformers_greedy(cluster: Cluster):
    async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
        stream = client.generate(PROMPT, service="chat", max_tokens=24)
        chunks = [c async for c in stream]
    assert len(chunks) > 1, "tokens must stream, not arrive in one piece"
    assert [c.index for c in chunks] == sorted(c.index for c in chunks)
    assert stream.usage.completion_tokens == 24 and stream.usage.finish_reason == "length"
    assert flatten(chunks) == hf_greedy(cluster.models_dir / "endless-llama", PROMPT, 24)


async def test_tiny_hub_style_model_serves(cluster: Cluster):
    async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
        done = await client.complete("Hello", service="summarize", max_tokens=8, temperature=0.9, seed=11)
        again = await client.complete("Hello", service="summarize", max_tokens=8, temperature=0.9, seed=11)
    assert done.usage.engine_id == "engine-0"  # the only engine hosting tiny-qwen2
    assert done.token_ids == again.token_ids  # seeded sampling is reproducible


@pytest.mark.parametrize(
    ("kwargs", "exc", "needle"),
    [
        ({"service": "nope"}, NotFound, "'nope'"),
        ({"prompt": ""}, InvalidArgument, "prompt"),
        ({"max_tokens": 0}, InvalidArgument, "sampling.max_tokens"),
        ({"max_tokens": -3}, InvalidArgument, "sampling.max_tokens"),
        ({"max_tokens": 100_000}, InvalidArgument, "sampling.max_tokens"),  # above the model's limit
        ({"temperature": -0.5}, InvalidArgument, "sampling.temperature"),
        ({"top_p": 0.0}, InvalidArgument, "sampling.top_p"),
        ({"top_p": 1.5}, InvalidArgument, "sampling.top_p"),
    ],
)
async def test_bad_input_statuses(cluster: Cluster, kwargs, exc, needle):
    args = {"prompt": "hi", "service": "chat", **kwargs}
    async with AsyncClient(cluster.scheduler, timeout_s=30, retries=0) as client:
        with pytest.raises(exc) as e:
            await client.complete(args.pop("prompt"), args.pop("service"), **args)
    assert needle in str(e.value)


async def test_service_the_static_plan_leaves_unplaced_fails_at_once(cluster: Cluster):
    # no waiting for a load that will never come: the placement leader says it places the model nowhere
    async with AsyncClient(cluster.scheduler, timeout_s=30, retries=1) as client:
        with pytest.raises(
            FailedPrecondition, match="static placement lists model 'tiny-mistral' on no engine"
        ):
            await client.complete("hi", service="unplaced", max_tokens=4)


async def test_cancel_stops_the_request_everywhere(cluster: Cluster):
    mig = cluster.addresses["migration"]
    async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
        stream = client.generate(PROMPT, service="chat", max_tokens=1900, request_id="to-cancel")
        async for _ in stream:
            break
        assert await client.cancel("to-cancel")
        _ = [c async for c in stream]  # drain to the final chunk
        assert stream.usage.finish_reason == "cancelled" and stream.usage.completion_tokens < 1900
        assert not await client.cancel("to-cancel")  # already finished
    await wait_running(mig, lambda r: sum(r.values()) == 0, 5, "the engine to drop the cancelled request")


async def test_deadline_propagates_and_frees_the_engine(cluster: Cluster):
    mig = cluster.addresses["migration"]
    async with AsyncClient(cluster.scheduler, timeout_s=0.5, retries=0) as client:
        with pytest.raises(DeadlineExceeded):
            await client.complete(PROMPT, service="chat", max_tokens=1900)
    await wait_running(mig, lambda r: sum(r.values()) == 0, 5, "the engine to drop the expired request")


async def test_retried_request_id_is_not_served_twice(cluster: Cluster):
    async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
        first = await client.complete(PROMPT, service="chat", max_tokens=12, request_id="idem-1")
        second = await client.complete(PROMPT, service="chat", max_tokens=12, request_id="idem-1")
        with pytest.raises(AlreadyExists, match="idem-1"):
            await client.complete("other prompt", service="chat", max_tokens=12, request_id="idem-1")
    assert second.token_ids == first.token_ids
    assert second.usage == first.usage  # the very same record replayed: same engine, same timings


async def test_profiler_learns_from_completed_requests(cluster: Cluster):
    async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
        for n in (5, 9):
            await client.complete(PROMPT, service="summarize", max_tokens=n, temperature=0.0)
    async with grpc.aio.insecure_channel(cluster.addresses["profiler"]) as ch:
        stub = profiler_pb2_grpc.ProfilerStub(ch)
        deadline = time.monotonic() + 5
        while True:
            p = (
                await stub.Predict(
                    profiler_pb2.PredictRequest(items=[profiler_pb2.PredictItem(service="summarize")])
                )
            ).predictions[0]
            if p.observations >= 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    assert p.observations >= 2 and 1 <= p.mean_output_tokens <= 16


async def test_placement_plan_and_migration_status(cluster: Cluster):
    async with grpc.aio.insecure_channel(cluster.addresses["placement-0"]) as ch:
        plan = await placement_pb2_grpc.PlacementStub(ch).GetPlan(placement_pb2.GetPlanRequest(), timeout=5)
    assert plan.leader_id in {"placement-0", "placement-1"}
    assert {e.engine_id: ({m.name for m in e.models}, set(e.loaded)) for e in plan.engines} == {
        "engine-0": ({"tiny-llama", "tiny-qwen2"},) * 2,
        "engine-1": ({"tiny-llama"},) * 2,
    }
    st = await migration_status(cluster.addresses["migration"])
    assert st.is_leader and st.leader_id == "migration"
    assert {e.engine_id for e in st.engines} == {"engine-0", "engine-1"}
    assert all(e.reporting and e.load.kv_capacity_bytes > 0 for e in st.engines)


async def test_client_disconnect_frees_engine_work(cluster: Cluster):
    mig = cluster.addresses["migration"]
    async with AsyncClient(cluster.scheduler, timeout_s=120) as client:
        stream = client.generate(PROMPT, service="chat", max_tokens=1900)
        async for _ in stream:
            break  # one chunk, then hang up
        await wait_running(mig, lambda r: sum(r.values()) == 1, 10, "the request to run")
        await stream.aclose()
    # Scheduler grace is 0.5 s; the engine must drop the request long before 1900 tokens are done.
    await wait_running(mig, lambda r: sum(r.values()) == 0, 5, "the engine to drop the request")


async def test_migration_mid_stream_is_invisible_to_the_client(cluster: Cluster):
    mig = cluster.addresses["migration"]
    async with AsyncClient(cluster.scheduler, timeout_s=120) as client:
        stream = client.generate(PROMPT, service="chat", max_tokens=LONG_TOKENS, request_id="move-me")
        chunks = []
        async for c in stream:
            chunks.append(c)
            if len(flatten(chunks)) >= 10:
                break
        running = await wait_running(mig, lambda r: sum(r.values()) == 1, 10, "the request to run")
        source = next(e for e, n in running.items() if n == 1)
        # the coordinator's view comes from load snapshots and may lag the engines by a snapshot: when
        # the engine it names does not hold the request, the other one must (it is streaming)
        for attempt in (source, ({"engine-0", "engine-1"} - {source}).pop()):
            target = ({"engine-0", "engine-1"} - {attempt}).pop()
            async with grpc.aio.insecure_channel(cluster.addresses[attempt]) as ch:
                try:
                    await engine_pb2_grpc.EngineStub(ch).Migrate(
                        engine_pb2.MigrateRequest(
                            request_id="move-me", destination=cluster.addresses[target]
                        ),
                        timeout=60,
                    )
                    break
                except grpc.aio.AioRpcError as e:
                    if e.code() != grpc.StatusCode.NOT_FOUND or attempt != source:
                        raise
        chunks.extend([c async for c in stream])
    assert stream.usage.engine_id == target and stream.usage.finish_reason == "length"
    indices = [c.index for c in chunks]
    assert indices == sorted(set(indices))
    assert flatten(chunks) == hf_greedy(cluster.models_dir / "endless-llama", PROMPT, LONG_TOKENS)


async def test_revoked_lease_reregisters(cluster: Cluster):
    client = etcd_client(cluster)
    await client.connect(wait=False)
    try:
        key = client.keys.node("engine-1")
        kv, _ = await client.get_kv(key)
        assert kv is not None and kv.lease
        await client.revoke(kv.lease)
        deadline = time.monotonic() + 3 * TTL_S + 5
        while time.monotonic() < deadline:
            new, _ = await client.get_kv(key)
            if new is not None and new.lease and new.lease != kv.lease:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("engine-1 did not re-register after its lease was revoked")
        assert (await client.lease_ttl(new.lease)) > 0
    finally:
        await client.close()


async def test_etcd_restart_is_survived(cluster: Cluster):
    cluster.etcd.restart(kill=True)
    n = len(cluster.addresses)
    cluster.wait_status(
        lambda s: len(s["nodes"]) == n, timeout=30, what="every node back after an etcd restart"
    )
    async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
        done = await client.complete(PROMPT, service="chat", max_tokens=4)
    assert done.usage.completion_tokens == 4


async def test_a_frozen_engine_is_cut_off_when_its_lease_expires(cluster: Cluster):
    """A host that stops answering (SIGSTOP: no reset, no FIN) loses its lease after the TTL; the
    scheduler then cuts its open streams and they resume elsewhere, rather than when TCP gives up."""
    mig = cluster.addresses["migration"]
    async with AsyncClient(cluster.scheduler, timeout_s=120) as client:
        stream = client.generate(PROMPT, service="chat", max_tokens=LONG_TOKENS)
        chunks = []
        async for c in stream:
            chunks.append(c)
            if len(flatten(chunks)) >= 8:
                break
        running = await wait_running(mig, lambda r: sum(r.values()) == 1, 10, "the request to run")
        frozen = next(e for e, n in running.items() if n == 1)
        cluster.procs.kill(frozen, signal.SIGSTOP, wait=False)
        t0 = time.monotonic()
        try:
            chunks.extend([c async for c in stream])
            elapsed = time.monotonic() - t0
        finally:
            cluster.procs.kill(frozen, signal.SIGCONT, wait=False)
    assert stream.usage.engine_id != frozen and stream.usage.finish_reason == "length"
    assert elapsed < TTL_S + 8, f"the stream resumed {elapsed:.1f}s after the freeze (TTL {TTL_S}s)"
    assert flatten(chunks) == hf_greedy(cluster.models_dir / "endless-llama", PROMPT, LONG_TOKENS)
    cluster.wait_status(
        lambda s: frozen in {n["node_id"] for n in s["nodes"]}, timeout=30, what=f"{frozen} to come back"
    )


# ---- destructive: each leaves the cluster with one fewer process ---------------------------------


async def test_engine_killed_mid_stream_fails_over_without_gaps(cluster: Cluster):
    mig = cluster.addresses["migration"]
    async with AsyncClient(cluster.scheduler, timeout_s=120) as client:
        stream = client.generate(PROMPT, service="chat", max_tokens=LONG_TOKENS)
        chunks = []
        async for c in stream:
            chunks.append(c)
            if len(flatten(chunks)) >= 8:
                break
        running = await wait_running(mig, lambda r: sum(r.values()) == 1, 10, "the request to run")
        victim = next(e for e, n in running.items() if n == 1)
        cluster.procs.kill(victim)
        chunks.extend([c async for c in stream])
    assert stream.usage.engine_id != victim and stream.usage.finish_reason == "length"
    indices = [c.index for c in chunks]
    assert indices == sorted(set(indices)), "no duplicated or reordered chunks"
    assert flatten(chunks) == hf_greedy(cluster.models_dir / "endless-llama", PROMPT, LONG_TOKENS)
    cluster.victim = victim


async def test_killed_engine_leaves_status_and_traffic_moves(cluster: Cluster):
    victim = getattr(cluster, "victim", None)
    if victim is None or cluster.procs[victim].alive:
        victim = "engine-0"
        cluster.procs.kill(victim)
    t0 = time.monotonic()
    cluster.wait_status(
        lambda s: victim not in {n["node_id"] for n in s["nodes"]},
        timeout=TTL_S + 3,
        what=f"{victim} to leave",
    )
    assert time.monotonic() - t0 <= TTL_S + 3
    async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
        engines = {
            (await client.complete("hi", service="chat", max_tokens=2)).usage.engine_id for _ in range(4)
        }
    assert engines == {"engine-0", "engine-1"} - {victim}


def test_killed_placement_leader_hands_over(cluster: Cluster):
    leaders = {x["role"]: x["leader"] for x in cluster.status()["leaders"]}
    old = leaders["placement"]
    cluster.procs.kill(old)
    standby = ({"placement-0", "placement-1"} - {old}).pop()
    cluster.wait_status(
        lambda s: {x["role"]: x["leader"] for x in s["leaders"]}.get("placement") == standby,
        timeout=3 * TTL_S + 5,
        what="the standby to take placement leadership",
    )
