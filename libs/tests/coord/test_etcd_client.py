"""EtcdClient against a real etcd: KV, txns, leases, watches, connect/retry and restart recovery."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import pytest
from llmfleet.config import EtcdSettings
from llmfleet.coord import EtcdClient, EtcdUnavailable, LeaseNotFound, LocalEtcd, WatchEvent, WatchInterrupted


async def test_kv_roundtrip_and_historical_prefix(etcd_client: EtcdClient) -> None:
    p = etcd_client.keys.services
    rev1 = await etcd_client.put(p + "a", b"1")
    await etcd_client.put(p + "b", b"2")
    await etcd_client.put(p.rstrip("/") + "x/other", b"not in prefix")
    assert await etcd_client.get(p + "a") == b"1"
    assert await etcd_client.get(p + "missing") is None
    kvs, rev = await etcd_client.get_prefix(p)
    assert kvs == {p + "a": b"1", p + "b": b"2"}
    assert rev > rev1
    assert await etcd_client.delete(p + "a") is True
    assert await etcd_client.delete(p + "a") is False
    assert (await etcd_client.get_prefix(p))[0] == {p + "b": b"2"}
    old, old_rev = await etcd_client.get_prefix(p, revision=rev1)
    assert old == {p + "a": b"1"} and old_rev >= rev
    kv, _ = await etcd_client.get_kv(p + "b")
    assert kv is not None and kv.value == b"2" and kv.lease == 0 and kv.version == 1
    assert etcd_client.connected


async def test_put_if_absent_and_delete_if_value(etcd_client: EtcdClient) -> None:
    k = etcd_client.keys.leader("x")
    assert await etcd_client.put_if_absent(k, b"a") is True
    assert await etcd_client.put_if_absent(k, b"b") is False
    assert await etcd_client.get(k) == b"a"
    assert await etcd_client.delete_if_value(k, b"b") is False
    assert await etcd_client.get(k) == b"a"
    assert await etcd_client.delete_if_value(k, b"a") is True
    assert await etcd_client.get(k) is None
    assert await etcd_client.put_if_absent(k, b"c") is True


async def test_leases(etcd: LocalEtcd, etcd_client: EtcdClient) -> None:
    k = etcd_client.keys.node("n1")
    lease = await etcd_client.grant(2)
    assert 0 < await etcd_client.lease_ttl(lease) <= 2
    assert await etcd_client.refresh(lease) == 2
    await etcd_client.put(k, b"v", lease=lease)
    kv, _ = await etcd_client.get_kv(k)
    assert kv is not None and kv.lease == lease
    out = await asyncio.to_thread(etcd.ctl, "lease", "timetolive", format(lease, "x"), "--keys")
    assert k in out, out
    assert await etcd_client.revoke(lease) is True
    assert await etcd_client.get(k) is None  # keys die with their lease
    assert await etcd_client.revoke(lease) is False
    assert await etcd_client.refresh(lease) <= 0
    assert await etcd_client.lease_ttl(lease) == -1
    with pytest.raises(LeaseNotFound):
        await etcd_client.put(k, b"v", lease=lease)
    with pytest.raises(LeaseNotFound):
        await etcd_client.put_if_absent(k, b"v", lease=lease)


async def test_watch_yields_one_batch_per_revision(etcd: LocalEtcd, etcd_client: EtcdClient) -> None:
    p = etcd_client.keys.placements
    _, rev = await etcd_client.get_prefix(p)
    batches: list[list[WatchEvent]] = []

    async def consume() -> None:
        async with contextlib.aclosing(etcd_client.watch_prefix(p, rev + 1)) as it:
            async for batch in it:
                batches.append(batch)
                if len(batches) == 4:
                    return

    task = asyncio.create_task(consume())
    await etcd_client.put(p + "e1", b"1")
    await etcd_client.put(p + "e2", b"2")
    await etcd_client.put(etcd_client.keys.node("elsewhere"), b"ignored")
    await etcd_client.put(p + "e1", b"1b")
    await asyncio.to_thread(etcd.ctl, "del", "--prefix", p)  # two deletes in ONE revision
    await asyncio.wait_for(task, 5)
    assert [[(e.kind, e.key, e.value) for e in b] for b in batches] == [
        [("put", p + "e1", b"1")],
        [("put", p + "e2", b"2")],
        [("put", p + "e1", b"1b")],
        [("delete", p + "e1", b""), ("delete", p + "e2", b"")],
    ]
    for b in batches:
        assert len({e.mod_revision for e in b}) == 1
    assert [b[0].mod_revision for b in batches] == sorted(b[0].mod_revision for b in batches)


async def test_watch_from_compacted_revision_raises(etcd_client: EtcdClient) -> None:
    p = etcd_client.keys.services
    first = await etcd_client.put(p + "a", b"1")
    for i in range(3):
        last = await etcd_client.put(p + "a", str(i).encode())
    await etcd_client.compact(last)
    with pytest.raises(WatchInterrupted) as ei:
        async with contextlib.aclosing(etcd_client.watch_prefix(p, first)) as it:
            async for _ in it:
                pytest.fail("no events expected from a compacted revision")
    assert ei.value.compact_revision == last


async def test_connect_no_wait_raises_quickly(tmp_path: Path) -> None:
    dead = LocalEtcd(tmp_path / "never-started")  # free port, nothing listening
    client = EtcdClient(EtcdSettings(endpoints=[dead.endpoint], lease_ttl_s=2, timeout_s=1.0))
    t0 = time.monotonic()
    with pytest.raises(EtcdUnavailable, match="unreachable"):
        await client.connect(wait=False)
    assert time.monotonic() - t0 < 3
    assert not client.connected
    with pytest.raises(EtcdUnavailable):  # operations give up after settings.timeout_s
        await client.get("/x")
    assert time.monotonic() - t0 < 6
    await client.close()


async def test_connect_wait_retries_until_etcd_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = LocalEtcd(tmp_path / "late")
    client = EtcdClient(EtcdSettings(endpoints=[server.endpoint], lease_ttl_s=2))
    caplog.set_level(logging.WARNING, logger="llmfleet.coord.client")
    task = asyncio.create_task(client.connect(wait=True))
    try:
        await asyncio.sleep(1.0)
        assert not task.done(), "connect(wait=True) must keep retrying while etcd is down"
        assert any("etcd unreachable at" in r.getMessage() for r in caplog.records)
        await server.astart()
        await asyncio.wait_for(task, 10)
        assert client.connected
        await client.put("/late/k", b"v")
        assert await client.get("/late/k") == b"v"
    finally:
        task.cancel()
        await client.close()
        server.stop()


async def test_failover_to_second_endpoint(etcd: LocalEtcd, tmp_path: Path) -> None:
    dead = LocalEtcd(tmp_path / "dead")
    client = EtcdClient(EtcdSettings(endpoints=[dead.endpoint, etcd.endpoint], lease_ttl_s=2))
    try:
        await client.connect(wait=False)
        assert client.endpoint == etcd.endpoint
        await client.put("/fo/k", b"v")
        assert await client.get("/fo/k") == b"v"
    finally:
        await client.close()


async def test_survives_etcd_kill_and_restart(etcd: LocalEtcd, etcd_client: EtcdClient) -> None:
    p = etcd_client.keys.nodes
    await etcd_client.put(p + "a", b"1")
    _, rev = await etcd_client.get_prefix(p)

    async def watch_forever() -> None:
        async with contextlib.aclosing(etcd_client.watch_prefix(p, rev + 1)) as it:
            async for _ in it:
                pass

    watch = asyncio.create_task(watch_forever())
    await asyncio.sleep(0.2)
    etcd.kill()
    with pytest.raises(EtcdUnavailable):
        await asyncio.wait_for(watch, 5)  # a watch fails loudly so callers re-list
    with pytest.raises(EtcdUnavailable):
        await etcd_client.get(p + "a", timeout=0.5)
    assert not etcd_client.connected
    await etcd.astart()
    assert await etcd_client.get(p + "a") == b"1"  # same data dir: data survived; channel recovered
    await etcd_client.put(p + "b", b"2")
    assert etcd_client.connected
