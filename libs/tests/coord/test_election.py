"""LeaderElection: one leader, hand-over on resign / lease loss, run() callbacks through etcd outages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from llmfleet.config import EtcdSettings
from llmfleet.coord import EtcdClient, LeaderElection, LocalEtcd
from llmfleet.testing import eventually

TTL = 2


@pytest.fixture
async def two_clients(etcd_settings: EtcdSettings) -> AsyncIterator[tuple[EtcdClient, EtcdClient]]:
    a, b = EtcdClient(etcd_settings), EtcdClient(etcd_settings)  # separate connections, like two processes
    await a.connect(wait=False)
    await b.connect(wait=False)
    yield a, b
    await a.close()
    await b.close()


async def elect_one(
    ea: LeaderElection, eb: LeaderElection
) -> tuple[LeaderElection, LeaderElection, asyncio.Task[None]]:
    """The winner, the loser and the loser's campaign (still waiting)."""
    ta, tb = asyncio.create_task(ea.campaign()), asyncio.create_task(eb.campaign())
    done, pending = await asyncio.wait({ta, tb}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1, "exactly one candidate must win"
    await asyncio.sleep(0.3)
    assert len(pending) == 1 and not next(iter(pending)).done(), "the loser must keep waiting"
    winner, loser = (ea, eb) if ta in done else (eb, ea)
    return winner, loser, next(iter(pending))


async def test_exactly_one_leader(two_clients: tuple[EtcdClient, EtcdClient]) -> None:
    a, b = two_clients
    ea, eb = LeaderElection(a, "placement", "A", TTL), LeaderElection(b, "placement", "B", TTL)
    winner, loser, campaign = await elect_one(ea, eb)
    try:
        assert winner.is_leader and not loser.is_leader
        assert await ea.observe() == await eb.observe() == winner.candidate_id
        kv, _ = await a.get_kv(a.keys.leader("placement"))
        assert kv is not None and kv.lease == winner.lease_id
        for _ in range(int(TTL * 1.25 / 0.1)):  # never two leaders, and leadership outlives the TTL
            assert winner.is_leader and not loser.is_leader
            await asyncio.sleep(0.1)
        assert not winner.lost.is_set()
    finally:
        campaign.cancel()
        await winner.resign()
        await loser.resign()


async def test_resign_hands_over(two_clients: tuple[EtcdClient, EtcdClient]) -> None:
    a, b = two_clients
    ea, eb = LeaderElection(a, "migration", "A", TTL), LeaderElection(b, "migration", "B", TTL)
    winner, loser, campaign = await elect_one(ea, eb)
    lease = winner.lease_id
    assert lease is not None
    await winner.resign()
    assert winner.lost.is_set() and not winner.is_leader
    await asyncio.wait_for(campaign, 3)
    assert loser.is_leader
    assert await ea.observe() == loser.candidate_id
    assert await a.lease_ttl(lease) == -1
    await loser.resign()
    assert await ea.observe() is None


async def test_revoked_leader_lease_hands_over(
    etcd: LocalEtcd, two_clients: tuple[EtcdClient, EtcdClient]
) -> None:
    a, b = two_clients
    ea, eb = LeaderElection(a, "placement", "A", TTL), LeaderElection(b, "placement", "B", TTL)
    winner, loser, campaign = await elect_one(ea, eb)
    assert winner.lease_id is not None
    await asyncio.to_thread(etcd.ctl, "lease", "revoke", format(winner.lease_id, "x"))
    await asyncio.wait_for(winner.lost.wait(), TTL + 1)
    assert not winner.is_leader
    await asyncio.wait_for(campaign, 3)
    assert loser.is_leader and await ea.observe() == loser.candidate_id
    await loser.resign()
    await winner.resign()


async def test_run_callbacks_resign_and_cancel_hand_over(two_clients: tuple[EtcdClient, EtcdClient]) -> None:
    a, b = two_clients
    events: list[str] = []

    def cbs(name: str) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
        async def on_elected() -> None:
            events.append(f"{name}:elected")

        async def on_lost() -> None:
            events.append(f"{name}:lost")

        return on_elected, on_lost

    ea, eb = LeaderElection(a, "placement", "A", TTL), LeaderElection(b, "placement", "B", TTL)
    ra = asyncio.create_task(ea.run(*cbs("A")))
    rb: asyncio.Task[None] | None = None
    try:
        await eventually(lambda: events == ["A:elected"] and ea.is_leader, 5, "A elected")
        rb = asyncio.create_task(eb.run(*cbs("B")))
        await asyncio.sleep(0.3)
        assert events == ["A:elected"] and not eb.is_leader
        await ea.resign()  # A's run() pauses one TTL before campaigning again: B takes over
        await eventually(lambda: events == ["A:elected", "A:lost", "B:elected"], 3, "B takes over")
        assert eb.is_leader and not ea.is_leader
        rb.cancel()  # clean shutdown of B: on_lost, then resign; A gets it back
        with contextlib.suppress(asyncio.CancelledError):
            await rb
        await eventually(lambda: events[3:] == ["B:lost", "A:elected"], TTL + 3, "A takes over again")
        assert await eb.observe() == "A"
        ra.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ra
        assert events[-1] == "A:lost"
        assert await ea.observe() is None
    finally:
        for t in (ra, rb):
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t


async def test_run_steps_down_during_outage_and_recovers(
    etcd: LocalEtcd, etcd_client: EtcdClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmfleet.coord.election")
    events: list[str] = []

    async def on_elected() -> None:
        events.append("elected")

    async def on_lost() -> None:
        events.append("lost")

    el = LeaderElection(etcd_client, "migration", "A", TTL)
    run = asyncio.create_task(el.run(on_elected, on_lost))
    try:
        await eventually(lambda: events == ["elected"], 5, "elected")
        etcd.kill()
        # Cannot refresh for a whole TTL: the lease may have expired, so the leader must step down.
        await eventually(lambda: events == ["elected", "lost"], TTL + 3, "stepped down")
        assert not el.is_leader and el.lost.is_set()
        assert not run.done()
        await asyncio.sleep(2.5)  # outlast the background revoke of the dropped lease
        await etcd.astart()  # etcd still holds our old lease (renewed on restart) and the key
        await eventually(lambda: events == ["elected", "lost", "elected"], 3 * TTL + 5, "re-elected")
        assert el.is_leader
        assert any("stale lease" in r.getMessage() for r in caplog.records), "old key freed by revoking"
        assert await el.observe() == "A"
        assert not run.done()
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
