"""The live placement loop against a real etcd: one transaction per plan with its meta, hysteresis,
infeasible plans keep the last good one, a new leader adopts the plan in etcd, writes are fenced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from llmfleet.config import ClusterConfig
from llmfleet.coord import LeaderElection, node_view, placement_view
from llmfleet.coord.desired import PlanMeta, get_placement_meta, write_plan
from llmfleet.policies.placement import (
    InstancePlan,
    PlacementInfeasible,
    PlacementNeeds,
    PlannerReport,
    ServiceLoad,
)
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, NodeRecord
from llmfleet_placement.controller import PlacementController
from llmfleet_placement.live import LivePlacementLoop

CONFIG = ClusterConfig.model_validate(
    {
        "services": {"chat": {"model": "tiny-llama"}, "summarize": {"model": "tiny-qwen2"}},
        "models": {"tiny-llama": {"source": "tiny://llama"}, "tiny-qwen2": {"source": "tiny://qwen2"}},
        "placement": {"policy": "dedicated_even", "interval_s": 0.2},
    }
)


class ScriptedPlanner(PlannerReport):
    """Returns ``plan`` (or raises ``error``); counts calls."""

    name = "scripted"
    needs = PlacementNeeds()

    def __init__(self, plan: list[InstancePlan]) -> None:
        self.plan, self.error, self.calls = plan, None, 0

    def place(self, gpus, services, context=None):
        self.calls += 1
        if self.error:
            raise PlacementInfeasible(self.error)
        return self.plan


class Rates:
    def __init__(self) -> None:
        self.rates = {"chat": 1.0}

    def loads(self, now):
        return [
            ServiceLoad(s, "tiny-llama" if s == "chat" else "tiny-qwen2", r) for s, r in self.rates.items()
        ]


def one_each() -> list[InstancePlan]:
    return [InstancePlan("a", ("tiny-llama",)), InstancePlan("b", ("tiny-qwen2",))]


@pytest.fixture
async def views(etcd_client) -> AsyncIterator[tuple]:
    for i in range(4):
        rec = NodeRecord(f"e{i}", ENGINE_ROLE, f"127.0.0.1:{9000 + i}", hardware="cpu")
        await etcd_client.put(etcd_client.keys.node(rec.node_id), rec.to_json())
    pv, nv = placement_view(etcd_client), node_view(etcd_client)
    for v in (pv, nv):
        await v.start()
    await nv.wait_for(lambda s: len(s) == 4, 5)
    yield pv, nv
    for v in (pv, nv):
        await v.stop()


def make_loop(etcd_client, views, planner, workload=None, **kw) -> LivePlacementLoop:
    return LivePlacementLoop(
        CONFIG,
        etcd_client,
        *views,
        planner=planner,
        policy="scripted",
        interval_s=0.2,
        workload=workload or Rates(),
        **kw,
    )


def models(pv) -> dict[str, tuple[str, ...]]:
    return {eid: tuple(m.name for m in p.models) for eid, p in pv.snapshot().items()}


async def settled(pv, want: dict[str, tuple[str, ...]]) -> None:
    await pv.wait_for(lambda s: {e: tuple(m.name for m in p.models) for e, p in s.items()} == want, 5)


async def test_first_plan_is_written_at_once_in_one_transaction(etcd_client, views) -> None:
    pv, _ = views
    loop = make_loop(etcd_client, views, ScriptedPlanner(one_each()))
    assert not await loop.adopt()
    assert await loop.tick() is not None  # nothing in etcd: unserved models, no hysteresis
    want = {"e0": ("tiny-llama",), "e1": ("tiny-qwen2",), "e2": (), "e3": ()}
    await settled(pv, want)
    meta = await get_placement_meta(etcd_client)
    assert meta is not None and (meta.plan_id, meta.policy, meta.gpus_in_use) == (1, "scripted", 2)
    assert "chat 1.00 rps" in meta.reason and "unserved" in meta.reason
    assert "e0: +tiny-llama" in meta.summary and "GPUs 0 -> 2" in meta.summary
    assert len({(await etcd_client.get_kv(etcd_client.keys.placement(e)))[0].mod_revision for e in want}) == 1
    assert [d.ok for d in loop.decisions] == [True] and loop.decisions[-1].summary.startswith("plan #1")
    assert await loop.tick() is None  # the same plan again: nothing to write


async def test_hysteresis_and_infeasible_plans_keep_the_last_good_plan(etcd_client, views) -> None:
    pv, _ = views
    planner = ScriptedPlanner(one_each())
    loop = make_loop(etcd_client, views, planner)
    await loop.tick()
    await settled(pv, {"e0": ("tiny-llama",), "e1": ("tiny-qwen2",), "e2": (), "e3": ()})
    planner.plan = [*one_each(), InstancePlan("c", ("tiny-llama",))]  # scale out chat
    assert await loop.tick() is None  # proposed once: held
    assert "applied if proposed for 2 intervals" in loop.decisions[-1].summary
    assert await loop.tick() is not None  # proposed twice: applied
    await settled(pv, {"e0": ("tiny-llama",), "e1": ("tiny-qwen2",), "e2": ("tiny-llama",), "e3": ()})
    planner.error = "model 'tiny-llama' is larger than any engine"
    assert await loop.tick() is None and await loop.tick() is None
    failed = [d for d in loop.decisions if not d.ok]
    assert len(failed) == 1 and "larger than any engine" in failed[0].error  # recorded once
    assert (await get_placement_meta(etcd_client)).plan_id == 2  # the last good plan stays
    planner.error = None
    planner.plan = one_each()  # scale in: e2 drains and goes idle (after confirmation)
    await loop.tick()
    await loop.tick()
    await settled(pv, {"e0": ("tiny-llama",), "e1": ("tiny-qwen2",), "e2": (), "e3": ()})
    assert "e2: -tiny-llama (idle)" in loop.decisions[-1].summary


async def test_a_dead_engine_loses_its_key_and_its_models_move_at_once(etcd_client, views) -> None:
    pv, nv = views
    planner = ScriptedPlanner(one_each())
    loop = make_loop(etcd_client, views, planner)
    await loop.tick()
    await settled(pv, {"e0": ("tiny-llama",), "e1": ("tiny-qwen2",), "e2": (), "e3": ()})
    await etcd_client.delete(etcd_client.keys.node("e0"))
    await nv.wait_for(lambda s: "e0" not in s, 5)
    assert await loop.tick() is not None  # tiny-llama is unserved: no waiting for confirmation
    await settled(pv, {"e1": ("tiny-qwen2",), "e2": ("tiny-llama",), "e3": ()})


async def test_a_new_leader_adopts_the_plan_and_waits_an_interval(etcd_client, views) -> None:
    pv, _ = views
    first = make_loop(etcd_client, views, ScriptedPlanner(one_each()))
    await first.tick()
    await settled(pv, {"e0": ("tiny-llama",), "e1": ("tiny-qwen2",), "e2": (), "e3": ()})
    planner = ScriptedPlanner(one_each())
    second = make_loop(etcd_client, views, planner)
    second.interval_s = 30.0
    task = asyncio.create_task(second.run())
    try:
        await asyncio.sleep(0.5)
        assert planner.calls == 0 and second.plan_id == 1
        assert second.decisions[-1].summary.startswith("adopted plan #1 (scripted")
    finally:
        task.cancel()


async def test_writes_are_fenced_by_the_leader_lease(etcd_client, views) -> None:
    election = LeaderElection(etcd_client, "placement", "p0", 2)
    await election.campaign()
    loop = make_loop(etcd_client, views, ScriptedPlanner(one_each()), election=election)
    assert await loop.tick() is not None
    meta = PlanMeta(99, "rogue")
    stale = (election.key, (election.lease_id or 0) + 1)
    assert not await write_plan(etcd_client, [DesiredPlacement("e3", ())], [], meta, leader=stale)
    assert (await get_placement_meta(etcd_client)).plan_id == 1
    await election.resign()
    loop.planner.plan = [*one_each(), InstancePlan("c", ("tiny-llama",))]
    loop.hysteresis.confirm = 1
    assert await loop.tick() is None  # not the leader any more: nothing written
    assert (await get_placement_meta(etcd_client)).plan_id == 1


async def test_with_a_planner_the_controller_writes_services_only(etcd_client, views) -> None:
    from llmfleet.coord import service_view

    pv, nv = views
    sv = service_view(etcd_client)
    await sv.start()
    try:
        await sv.wait_for(lambda s: True, 5)
        c = PlacementController(CONFIG, etcd_client, pv, sv, nv, manage_placement=False)
        assert await c.reconcile_once() == 5  # seeds 2 services, 2 models and the marker
        await sv.wait_for(lambda s: set(s) == {"chat", "summarize"}, 5)
        assert pv.snapshot() == {}
    finally:
        await sv.stop()


class Silent(Rates):
    """A monitor nobody has reported to yet (a new leader's, before the schedulers find it)."""

    def has_data(self, now):
        return False


async def test_a_new_term_waits_for_the_schedulers_reports(etcd_client, views) -> None:
    pv, _ = views
    bootstrap = ScriptedPlanner(one_each())
    assert (
        await make_loop(etcd_client, views, bootstrap, workload=Silent()).tick() is not None
    )  # nothing in force
    await settled(pv, {"e0": ("tiny-llama",), "e1": ("tiny-qwen2",), "e2": (), "e3": ()})
    planner = ScriptedPlanner([])
    loop = make_loop(etcd_client, views, planner, workload=Silent())
    loop.term_start = loop.clock()
    assert await loop.tick() is None and planner.calls == 0  # an empty monitor is no reason to scale in
    loop.monitor_grace_s = 0.0
    await loop.tick()
    assert planner.calls == 1


async def test_seallm_scores_plans_on_the_monitored_requests(etcd_client, views) -> None:
    from llmfleet.monitor import FleetMonitor, ServiceMonitor
    from llmfleet.monitor.records import Completion
    from llmfleet.policies.placement import GpuPool, make_placement_policy
    from llmfleet.sim.plan_eval import ClusterPlanEvaluators
    from llmfleet_placement.workload import MonitorWorkload

    pv, _ = views
    config = CONFIG.model_copy(update={"placement": CONFIG.placement.model_copy(update={"policy": "seallm"})})
    local, fleet = ServiceMonitor(), FleetMonitor()
    workload = MonitorWorkload(fleet, config.service_specs, None, config, ClusterPlanEvaluators("seallm"))
    assert workload.evaluator(100.0, GpuPool("cpu", 4)) is None  # nothing to replay yet
    for i in range(40):
        t = 60.0 + i * 0.5
        service, model = ("chat", "tiny-llama") if i % 4 else ("summarize", "tiny-qwen2")
        local.arrive(service, model, t)
        local.complete(Completion.timed(service, model, t, t + 0.05, t + 0.3, 20, 16))
    slos = {s.name: s.slo for s in config.service_specs()}
    fleet.update("scheduler", local.stats(80.0, slos), 80.0)
    loop = make_loop(
        etcd_client, views, make_placement_policy("seallm"), workload=workload, clock=lambda: 80.0
    )
    loop.config = config
    assert await loop.tick() is not None
    await pv.wait_for(lambda s: len(s) == 4, 5)
    hosted = {m.name for p in pv.snapshot().values() for m in p.models}
    assert hosted == {"tiny-llama", "tiny-qwen2"}


async def test_seallm_with_no_workload_yet_serves_every_model_then_waits_for_requests(
    etcd_client, views
) -> None:
    """A fresh fleet: nothing placed, no request seen. SeaLLM still gives every service its minimal
    dedicated GPUs (SeaLLM §4's rule for a new service), so "up" becomes servable."""
    from llmfleet.monitor import FleetMonitor
    from llmfleet.policies.placement import make_placement_policy
    from llmfleet.sim.plan_eval import ClusterPlanEvaluators
    from llmfleet_placement.workload import MonitorWorkload

    pv, _ = views
    config = CONFIG.model_copy(update={"placement": CONFIG.placement.model_copy(update={"policy": "seallm"})})
    workload = MonitorWorkload(
        FleetMonitor(), config.service_specs, None, config, ClusterPlanEvaluators("seallm")
    )
    loop = make_loop(
        etcd_client, views, make_placement_policy("seallm"), workload=workload, clock=lambda: 80.0
    )
    loop.config = config
    assert await loop.tick() is not None
    await pv.wait_for(
        lambda s: {m.name for p in s.values() for m in p.models} == {"tiny-llama", "tiny-qwen2"}, 5
    )
    assert "no recent workload" in loop.decisions[-1].reason
    n = len(loop.decisions)
    assert await loop.tick() is None  # the engines are still loading: the same plan, nothing rewritten
    assert len(loop.decisions) == n


async def test_no_engine_yet_is_a_wait_then_an_error(etcd_client) -> None:
    """At start-up the leader may run before any engine registers: not an error within the grace."""
    pv, nv = placement_view(etcd_client), node_view(etcd_client)
    for v in (pv, nv):
        await v.start()
    try:
        planner = ScriptedPlanner(one_each())
        loop = make_loop(etcd_client, (pv, nv), planner)
        loop.term_start = loop.clock()
        assert await loop.tick() is None and not loop.decisions and planner.calls == 0
        loop.monitor_grace_s = 0.0
        assert await loop.tick() is None
        assert [d.error for d in loop.decisions] == ["no live engines to place on"]
    finally:
        for v in (pv, nv):
            await v.stop()


async def test_unseeded_services_are_looked_at_again_shortly(etcd_client, views) -> None:
    """At start the controller seeds services/ just after the leader's first tick: the leader must not
    then wait a whole interval (30 s by default) before its first plan."""
    seeded = False

    async def desired():
        return (CONFIG, []) if seeded else None

    planner = ScriptedPlanner(one_each())
    loop = make_loop(etcd_client, views, planner, desired=desired)
    loop.interval_s = 30.0
    assert await loop.tick() is None and loop.retry_soon and planner.calls == 0
    seeded = True
    await asyncio.wait_for(loop.wait_interval(), 5)  # RETRY_SOON_S, not the interval
