"""PrefixView: consistent mirror of a prefix (one revision at a time), wait_for, subscribe, recovery."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import pytest
from llmfleet.coord import (
    EtcdClient,
    LocalEtcd,
    PrefixView,
    delete_service,
    node_view,
    put_service,
    service_view,
)
from llmfleet.spec.services import ServiceSpec
from llmfleet.testing import eventually
from llmfleet.types import NodeRecord, Slo


@pytest.fixture
async def raw_view(etcd_client: EtcdClient) -> AsyncIterator[PrefixView[bytes]]:
    view: PrefixView[bytes] = PrefixView(etcd_client, etcd_client.keys.placements, bytes)
    await view.start()
    await asyncio.wait_for(view.ready.wait(), 5)
    yield view
    await view.stop()


async def test_view_reflects_puts_and_deletes(etcd_client: EtcdClient) -> None:
    await put_service(etcd_client, ServiceSpec("chat", "m1"))
    view = service_view(etcd_client)
    await view.start()
    try:
        snap = await view.wait_for(lambda s: "chat" in s, 5)
        assert snap == {"chat": ServiceSpec("chat", "m1")}
        assert view.revision > 0
        spec = ServiceSpec("code", "m2", slo=Slo(ttft_s=1.0, tpot_s=0.1), priority=2)
        await put_service(etcd_client, spec)
        await view.wait_for(lambda s: s.get("code") == spec, 5)
        await delete_service(etcd_client, "chat")
        snap = await view.wait_for(lambda s: "chat" not in s, 5)
        assert snap == {"code": spec}
        _, rev = await etcd_client.get_prefix(etcd_client.keys.services)
        assert view.revision == rev  # the last change under the prefix is the latest revision here
        snap["mutated"] = spec
        assert "mutated" not in view.snapshot()  # snapshot() is a copy
    finally:
        await view.stop()


async def test_snapshot_equals_get_prefix_at_same_revision(
    etcd: LocalEtcd, etcd_client: EtcdClient, raw_view: PrefixView[bytes]
) -> None:
    p = etcd_client.keys.placements
    rng = random.Random(7)
    stop = asyncio.Event()

    async def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            k = f"{p}e{rng.randrange(6)}"
            if rng.random() < 0.3:
                await etcd_client.delete(k)
            else:
                await etcd_client.put(k, f"v{i}".encode())
            if i % 15 == 0:  # a multi-key revision from another writer
                await asyncio.to_thread(etcd.ctl, "del", "--prefix", p)

    task = asyncio.create_task(writer())
    checked = set()
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            snap, rev = raw_view.snapshot(), raw_view.revision  # taken together: no await in between
            truth, _ = await etcd_client.get_prefix(p, revision=rev)
            assert snap == {k[len(p) :]: v for k, v in truth.items()}, f"at revision {rev}"
            checked.add(rev)
            await asyncio.sleep(rng.random() * 0.02)
    finally:
        stop.set()
        await task
    assert len(checked) > 10, "the view should have moved through many revisions"
    final, rev = await etcd_client.get_prefix(p)
    await raw_view.wait_for(lambda s: s == {k[len(p) :]: v for k, v in final.items()}, 5)


async def test_wait_for_times_out(raw_view: PrefixView[bytes]) -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"condition not met within 0\.3s"):
        await raw_view.wait_for(lambda s: "never" in s, 0.3)
    assert 0.25 < time.monotonic() - t0 < 2


async def test_undecodable_values_are_skipped(etcd_client: EtcdClient) -> None:
    good = NodeRecord(node_id="a", role="engine", address="127.0.0.1:1")
    await etcd_client.put(etcd_client.keys.node("bad"), b"{not json")
    await etcd_client.put(etcd_client.keys.node("a"), good.to_json())
    view = node_view(etcd_client)
    await view.start()
    try:
        assert await view.wait_for(lambda s: "a" in s, 5) == {"a": good}
        await etcd_client.put(etcd_client.keys.node("a"), b"garbage")  # a bad update drops the entry
        await view.wait_for(lambda s: "a" not in s, 5)
        await etcd_client.put(etcd_client.keys.node("b"), good.to_json())
        assert await view.wait_for(lambda s: "b" in s, 5) == {"b": good}
    finally:
        await view.stop()


async def test_subscribe_yields_on_ready_and_after_each_change(
    etcd_client: EtcdClient, raw_view: PrefixView[bytes]
) -> None:
    p = etcd_client.keys.placements
    seen: list[tuple[int, dict[str, bytes]]] = []

    async def consume() -> None:
        async for rev, snap in raw_view.subscribe():
            seen.append((rev, snap))

    task = asyncio.create_task(consume())
    await eventually(lambda: len(seen) >= 1, 5, "the initial snapshot")
    assert seen == [(raw_view.revision, {})]
    r1 = await etcd_client.put(p + "x", b"1")
    await eventually(lambda: len(seen) >= 2, 5, "the first change")
    r2 = await etcd_client.put(p + "x", b"2")
    await eventually(lambda: len(seen) >= 3, 5, "the second change")
    assert seen[1:] == [(r1, {"x": b"1"}), (r2, {"x": b"2"})]
    await raw_view.stop()
    await asyncio.wait_for(task, 2)  # subscribers end when the view stops


async def test_view_recovers_after_etcd_restart(etcd: LocalEtcd, etcd_client: EtcdClient) -> None:
    view: PrefixView[bytes] = PrefixView(etcd_client, etcd_client.keys.placements, bytes)
    p = etcd_client.keys.placements
    await etcd_client.put(p + "before", b"1")
    await view.start()
    try:
        await view.wait_for(lambda s: "before" in s, 5)
        etcd.kill()
        await asyncio.sleep(0.5)
        assert view.snapshot() == {"before": b"1"}  # last known state stays readable
        await etcd.astart()
        await etcd_client.put(p + "after", b"2")
        await etcd_client.delete(p + "before")
        await view.wait_for(lambda s: s == {"after": b"2"}, 10)
        assert view.relists >= 1
        assert view.running
    finally:
        await view.stop()
