"""Registration: lease-bound key that re-registers after revocation, key loss and etcd restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from llmfleet.coord import EtcdClient, LocalEtcd, Registration
from llmfleet.testing import eventually
from llmfleet.types import NodeRecord

TTL = 2


@pytest.fixture
def record() -> dict[str, tuple[str, ...]]:
    """What ``reg`` publishes; a test changes it, then calls ``update()``."""
    return {"models": ("m1",)}


@pytest.fixture
async def reg(etcd_client: EtcdClient, record: dict[str, tuple[str, ...]]) -> AsyncIterator[Registration]:
    def value() -> bytes:
        return NodeRecord(
            node_id="n1", role="engine", address="127.0.0.1:1", models=record["models"]
        ).to_json()

    r = Registration(etcd_client, etcd_client.keys.node("n1"), value, TTL)
    await r.start()
    await r.wait_registered(5)
    yield r
    await r.stop()


async def bound_to(client: EtcdClient, key: str) -> int | None:
    kv, _ = await client.get_kv(key)
    return kv.lease if kv is not None and kv.lease else None


async def test_registers_key_bound_to_a_lease(
    etcd: LocalEtcd, etcd_client: EtcdClient, reg: Registration
) -> None:
    raw = await etcd_client.get(reg.key)
    assert raw is not None and NodeRecord.from_json(raw).models == ("m1",)
    assert reg.lease_id is not None and await bound_to(etcd_client, reg.key) == reg.lease_id
    out = await asyncio.to_thread(etcd.ctl, "lease", "timetolive", format(reg.lease_id, "x"), "--keys")
    assert f"granted with TTL({TTL}s)" in out and reg.key in out, out
    await asyncio.sleep(TTL * 1.25)  # kept alive past its TTL
    assert await etcd_client.lease_ttl(reg.lease_id) > 0
    assert await etcd_client.get(reg.key) is not None
    assert reg.reregistrations == 0


async def test_revoked_lease_reregisters(etcd: LocalEtcd, etcd_client: EtcdClient, reg: Registration) -> None:
    old = reg.lease_id
    assert old is not None
    await asyncio.to_thread(etcd.ctl, "lease", "revoke", format(old, "x"))
    assert await etcd_client.get(reg.key) is None

    async def back() -> bool:
        lease = await bound_to(etcd_client, reg.key)
        return lease is not None and lease != old

    await eventually(back, TTL + 2, "key re-registered on a new lease")
    assert reg.lease_id == await bound_to(etcd_client, reg.key)
    assert reg.reregistrations == 1 and reg.registered.is_set()
    assert await etcd_client.lease_ttl(reg.lease_id) > 0


async def test_deleted_key_is_put_back_on_same_lease(etcd_client: EtcdClient, reg: Registration) -> None:
    lease = reg.lease_id
    assert await etcd_client.delete(reg.key)

    async def back() -> bool:
        return await bound_to(etcd_client, reg.key) == lease

    await eventually(back, TTL + 2, "key put back")
    assert reg.reregistrations == 0


async def test_update_republishes_current_value(
    etcd_client: EtcdClient, reg: Registration, record: dict[str, tuple[str, ...]]
) -> None:
    record["models"] = ("m1", "m2")
    await reg.update()
    raw = await etcd_client.get(reg.key)
    assert raw is not None and NodeRecord.from_json(raw).models == ("m1", "m2")
    assert await bound_to(etcd_client, reg.key) == reg.lease_id


async def test_stop_revokes_lease_and_key(etcd_client: EtcdClient, reg: Registration) -> None:
    lease = reg.lease_id
    assert lease is not None
    await reg.stop()
    assert await etcd_client.get(reg.key) is None  # gone at once, not after the TTL
    assert await etcd_client.lease_ttl(lease) == -1
    assert not reg.registered.is_set()


async def test_survives_etcd_kill_and_restart(
    etcd: LocalEtcd, etcd_client: EtcdClient, reg: Registration
) -> None:
    assert reg.running
    etcd.kill()
    await eventually(lambda: not reg.registered.is_set(), TTL + 4, "registered cleared while etcd is down")
    assert reg.running
    await etcd.astart()  # same data dir: etcd keeps (and renews) the lease across a restart
    await eventually(lambda: reg.registered.is_set(), TTL + 4, "registered again")

    async def bound_live() -> bool:
        lease = await bound_to(etcd_client, reg.key)
        return lease is not None and lease == reg.lease_id and await etcd_client.lease_ttl(lease) > 0

    await eventually(bound_live, TTL + 2, "key bound to a live lease after restart")
    assert reg.running, "the registration task must never crash"


async def test_reregisters_after_partition_longer_than_ttl(
    etcd: LocalEtcd, etcd_client: EtcdClient, reg: Registration
) -> None:
    old = reg.lease_id
    etcd.pause()  # etcd stops answering (calls time out) while the lease's TTL runs out
    try:
        await eventually(lambda: not reg.registered.is_set(), TTL + 3, "registered cleared during partition")
        await asyncio.sleep(0.5)  # margin: cleared means no refresh for a whole TTL already
    finally:
        etcd.resume()

    async def back() -> bool:
        lease = await bound_to(etcd_client, reg.key)
        return lease is not None and lease == reg.lease_id and lease != old

    await eventually(back, TTL + 4, "re-registered on a new lease after the partition")
    assert await etcd_client.lease_ttl(old) == -1  # the old lease expired during the partition
    assert reg.reregistrations == 1 and reg.registered.is_set()


async def test_reregisters_after_etcd_lost_its_data(
    etcd: LocalEtcd, etcd_client: EtcdClient, reg: Registration
) -> None:
    old = reg.lease_id
    etcd.kill()
    etcd.wipe()
    await etcd.astart()  # a brand-new cluster: the lease and the key are gone

    async def back() -> bool:
        lease = await bound_to(etcd_client, reg.key)
        return lease is not None and lease == reg.lease_id and lease != old

    await eventually(back, TTL + 6, "re-registered on the new cluster")
    assert reg.reregistrations >= 1
    assert reg.running
