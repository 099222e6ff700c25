"""The cluster file is a bootstrap: the leader seeds services/ and models/ once and never reverts
runtime changes (``--reseed`` replaces them explicitly); the live loop plans for etcd's services."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from llmfleet.config import ClusterConfig
from llmfleet.coord import node_view, placement_view, put_service, service_view
from llmfleet.coord.desired import ModelEntry, get_seed, write_desired
from llmfleet.policies.placement import make_placement_policy
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import ENGINE_ROLE, NodeRecord, Slo
from llmfleet_placement.controller import (
    PlacementController,
    read_runtime_config,
    runtime_config,
)
from llmfleet_placement.live import LivePlacementLoop
from llmfleet_placement.workload import NoTraffic

CONFIG = ClusterConfig.model_validate(
    {
        "services": {"chat": {"model": "tiny-llama"}, "summarize": {"model": "tiny-qwen2"}},
        "models": {"tiny-llama": {"source": "tiny://llama"}, "tiny-qwen2": {"source": "tiny://qwen2"}},
        "engines": {"e0": {"models": ["tiny-llama"]}, "e1": {"models": ["tiny-qwen2"]}},
    }
)
PLANNED = CONFIG.model_copy(
    update={"placement": CONFIG.placement.model_copy(update={"policy": "dedicated_even", "interval_s": 0.2})}
)
QA = ServiceSpec("qa", "tiny-mistral", Slo(ttft_s=1.0, tpot_s=0.1))
MISTRAL = ModelEntry("tiny-mistral", "tiny://mistral")


@pytest.fixture
async def views(etcd_client) -> AsyncIterator[tuple]:
    for i in range(3):
        rec = NodeRecord(f"e{i}", ENGINE_ROLE, f"127.0.0.1:{9000 + i}", hardware="cpu")
        await etcd_client.put(etcd_client.keys.node(rec.node_id), rec.to_json())
    vs = placement_view(etcd_client), service_view(etcd_client), node_view(etcd_client)
    for v in vs:
        await v.start()
    await vs[2].wait_for(lambda s: len(s) == 3, 5)
    yield vs
    for v in vs:
        await v.stop()


async def services(etcd_client) -> dict[str, ServiceSpec]:
    raw, _ = await etcd_client.get_prefix(etcd_client.keys.services)
    return {etcd_client.keys.leaf(k): ServiceSpec.from_json(v) for k, v in raw.items()}


async def test_seeds_once_and_never_reverts_runtime_changes(etcd_client, views) -> None:
    c = PlacementController(CONFIG, etcd_client, *views, config_path="cluster.yaml", leader_id="p0")
    assert await c.reconcile_once() == 5 + 2  # 2 services, 2 models, the marker; 2 placement keys
    seed = await get_seed(etcd_client)
    assert seed is not None and seed.services == ("chat", "summarize") and seed.leader == "p0"
    faster = ServiceSpec("chat", "tiny-llama", Slo(ttft_s=0.5, tpot_s=0.05))
    assert await write_desired(etcd_client, [faster, QA], [MISTRAL], ["summarize"])
    want = {"chat": faster, "qa": QA}
    for controller in (c, PlacementController(CONFIG, etcd_client, *views)):  # a resync; a new leader
        await views[1].wait_for(lambda s: s == want, 5)
        assert await controller.reconcile_once() == 0
        assert await services(etcd_client) == want
    assert (await get_seed(etcd_client)) == seed


async def test_seeding_adds_only_what_etcd_lacks(etcd_client, views) -> None:
    mine = ServiceSpec("chat", "tiny-llama", Slo(ttft_s=9.0, tpot_s=0.9))
    await put_service(etcd_client, mine)  # e.g. an `llmfleet apply` before any leader ran
    c = PlacementController(CONFIG, etcd_client, *views, manage_placement=False)
    assert await c.reconcile_once() == 1 + 2 + 1  # summarize, both models, the marker
    assert (await services(etcd_client))["chat"] == mine
    assert (await get_seed(etcd_client)).services == ("summarize",)


async def test_reseed_replaces_services_and_models_with_the_config(etcd_client, views) -> None:
    await PlacementController(CONFIG, etcd_client, *views, manage_placement=False).reconcile_once()
    assert await write_desired(etcd_client, [QA], [MISTRAL], ["chat"])
    c = PlacementController(CONFIG, etcd_client, *views, manage_placement=False, reseed=True)
    assert await c.reconcile_once() == 5
    assert set(await services(etcd_client)) == {"chat", "summarize"}
    raw, _ = await etcd_client.get_prefix(etcd_client.keys.models)
    assert {etcd_client.keys.leaf(k) for k in raw} == {"tiny-llama", "tiny-qwen2"}
    assert (await get_seed(etcd_client)).reseed
    assert await write_desired(etcd_client, [QA], [MISTRAL])
    assert await c.reconcile_once() == 0  # once per process: the runtime change stays
    assert "qa" in await services(etcd_client)


async def test_a_batch_read_before_a_concurrent_change_writes_nothing(etcd_client) -> None:
    _, rev = await etcd_client.get_prefix(etcd_client.keys.services)
    await put_service(etcd_client, ServiceSpec("chat", "tiny-llama"))  # someone else, after our read
    stale = [QA, ServiceSpec("chat", "tiny-llama", Slo(ttft_s=1.0, tpot_s=0.1))]
    assert not await write_desired(etcd_client, stale, [MISTRAL], unchanged_since=rev)
    assert set(await services(etcd_client)) == {"chat"}  # qa not written either: all or nothing
    assert await etcd_client.get(etcd_client.keys.model("tiny-mistral")) is None


def test_runtime_config_leaves_out_services_it_cannot_plan() -> None:
    nowhere = ServiceSpec("ghost", "tiny-gpt")
    uncatalogued = ModelEntry("my-model", "/ckpt/my-model")
    svc = {"qa": QA, "ghost": nowhere, "mine": ServiceSpec("mine", "my-model")}
    cfg, problems = runtime_config(PLANNED, svc, {"tiny-mistral": MISTRAL, "my-model": uncatalogued})
    assert sorted(cfg.services) == ["qa"]
    assert cfg.services["qa"].slo.ttft_s == 1.0 and cfg.model_spec("tiny-mistral").source == "tiny://mistral"
    assert cfg.catalog_models() == {"tiny-mistral": "tiny-mistral"}
    assert any("'ghost'" in p and "not declared" in p for p in problems)
    assert any("'mine'" in p and "sim_model" in p for p in problems)
    cfg, problems = runtime_config(CONFIG, svc, {"my-model": uncatalogued})  # static: no catalog needed
    assert sorted(cfg.services) == ["mine"] and len(problems) == 2


async def test_the_live_loop_places_added_services_and_releases_deleted_ones(etcd_client, views) -> None:
    pv, _, nv = views
    await PlacementController(PLANNED, etcd_client, *views, manage_placement=False).reconcile_once()
    loop = LivePlacementLoop(
        PLANNED,
        etcd_client,
        pv,
        nv,
        planner=make_placement_policy("dedicated_even"),
        policy="dedicated_even",
        interval_s=0.2,
        workload=NoTraffic(),
        desired=lambda: read_runtime_config(etcd_client, PLANNED),
    )
    loop.hysteresis.confirm = 1

    def hosted() -> set[str]:
        return {m.name for p in pv.snapshot().values() for m in p.models}

    await loop.tick()
    await pv.wait_for(lambda s: hosted() == {"tiny-llama", "tiny-qwen2"}, 5)
    assert await write_desired(etcd_client, [QA], [MISTRAL])
    assert await loop.tick() is not None
    await pv.wait_for(lambda s: hosted() == {"tiny-llama", "tiny-qwen2", "tiny-mistral"}, 5)
    assert await write_desired(etcd_client, delete_services=["qa", "summarize"])
    assert await loop.tick() is not None
    await pv.wait_for(lambda s: hosted() == {"tiny-llama"}, 5)
    assert await write_desired(etcd_client, [ServiceSpec("x", "undeclared")])
    await loop.tick()
    assert not loop.decisions[-1].ok and "'x'" in loop.decisions[-1].error


async def test_the_live_loop_does_not_plan_before_the_seeding(etcd_client, views) -> None:
    pv, _, nv = views
    planner = make_placement_policy("dedicated_even")
    loop = LivePlacementLoop(
        PLANNED,
        etcd_client,
        pv,
        nv,
        planner=planner,
        policy="dedicated_even",
        interval_s=0.2,
        desired=lambda: read_runtime_config(etcd_client, PLANNED),
    )
    assert not await loop.refresh_services()
    assert await loop.tick() is None and pv.snapshot() == {}
