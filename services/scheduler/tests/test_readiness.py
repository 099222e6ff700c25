"""Ready means servable: not before placement seeded the services, not while a service that
must be served has no engine with its model; services marked scale_to_zero and services the placement
leader will not place do not hold it; once reached it stays (a start-up gate)."""

from __future__ import annotations

from llmfleet.spec.services import ServiceSpec
from llmfleet.testing import StaticView
from llmfleet.types import ENGINE_ROLE, NodeRecord
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.readiness import Readiness, unserved


def node(eid: str, *models: str) -> NodeRecord:
    return NodeRecord(eid, ENGINE_ROLE, f"127.0.0.1:{20000 + len(eid)}", models=models)


def test_unserved_skips_scale_to_zero_services() -> None:
    services = {
        "chat": ServiceSpec("chat", "a"),
        "qa": ServiceSpec("qa", "b"),
        "rare": ServiceSpec("rare", "c", scale_to_zero=True),
    }
    assert unserved(services, [node("e0", "a")]) == ["qa"]
    assert unserved(services, [node("e0", "a", "b")]) == []


async def test_readiness_waits_for_seeding_and_engines_then_latches() -> None:
    services = StaticView({"chat": ServiceSpec("chat", "a"), "static": ServiceSpec("static", "z")})
    nodes: StaticView[NodeRecord] = StaticView({})
    unplaced = StaticView({"": {"z": "the static placement lists model 'z' on no engine"}})
    d = ClusterDirectory(services_view=services, nodes_view=nodes, unplaced_view=unplaced)
    published: list[bool] = []
    seeded = [False]

    async def publish(ok: bool) -> None:
        published.append(ok)

    async def is_seeded() -> bool:
        return seeded[0]

    r = Readiness(d, publish, seeded=is_seeded)
    await r.refresh()
    assert not r.servable and r.missing == ["(services not seeded by placement yet)"]
    seeded[0] = True
    await r.refresh()
    assert not r.servable and r.missing == ["chat"]  # "static" is left out by placement: not waited for
    nodes.items["e0"] = node("e0", "a")
    await r.refresh()
    assert r.servable and published == [True]
    nodes.items.clear()  # the engine died: still ready (its requests wait for placement instead)
    await r.refresh()
    assert r.servable and published == [True]
