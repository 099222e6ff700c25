"""LeaderElection: one leader per role via ``leaders/{role}`` bound to the leader's own lease."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from llmfleet.coord.client import EtcdClient, LeaseNotFound

log = logging.getLogger(__name__)


class LeaderElection:
    """Campaign for ``keys.leader(role)``; the key holds ``candidate_id`` and dies with our lease.

    Leadership is lost (``lost`` is set, ``is_leader`` turns False) when the key is deleted or taken,
    when the lease is revoked or expires, or when the lease could not be refreshed for a whole TTL
    (etcd unreachable: we must assume it expired).
    """

    def __init__(self, client: EtcdClient, role: str, candidate_id: str, ttl_s: int | None = None) -> None:
        self.client = client
        self.role = role
        self.candidate_id = candidate_id
        self.key = client.keys.leader(role)
        self.ttl_s = int(ttl_s or client.settings.lease_ttl_s)
        self.lost = asyncio.Event()
        self.terms = 0  # times elected
        self._value = candidate_id.encode()
        self._is_leader = False
        self._lease_id: int | None = None
        self._last_refresh = 0.0
        self._keepalive: asyncio.Task[None] | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._bg: set[asyncio.Task[None]] = set()
        self._resigned = False  # run() pauses before re-campaigning after a voluntary resign
        self._stale: set[int] = set()  # our dropped leases that etcd may still hold (e.g. across an outage)

    @property
    def is_leader(self) -> bool:
        return self._is_leader

    @property
    def lease_id(self) -> int | None:
        return self._lease_id

    @property
    def interval_s(self) -> float:
        return max(self.ttl_s / 3.0, 0.2)

    async def observe(self, timeout: float | None = None) -> str | None:
        """The current leader's id, or None (raises EtcdUnavailable if etcd cannot be reached)."""
        raw = await self.client.get(self.key, timeout=timeout)
        return raw.decode() if raw is not None else None

    # -- campaign ----------------------------------------------------------------------------------------
    async def campaign(self) -> None:
        """Block until this candidate holds the leader key (retries through etcd outages)."""
        backoff = 0.1
        while True:
            try:
                lease = await self._ensure_lease()
                if await self.client.put_if_absent(self.key, self._value, lease):
                    kv, _ = await self.client.get_kv(self.key)
                    if kv is not None and kv.value == self._value and kv.lease == lease:
                        self._become_leader(kv.mod_revision)
                        return
                    continue
                kv, rev = await self.client.get_kv(self.key)
                if kv is None:
                    continue
                if kv.value == self._value and kv.lease == lease:
                    self._become_leader(kv.mod_revision)  # already ours (e.g. a campaign raced a cancel)
                    return
                if kv.lease in self._stale:  # our own key from a lease we gave up on: free it now
                    log.info("election %s: revoking our stale lease %x", self.role, kv.lease)
                    await self.client.revoke(kv.lease)
                    self._stale.discard(kv.lease)
                    continue
                log.info(
                    "election %s: %s waits; leader is %s", self.role, self.candidate_id, kv.value.decode()
                )
                await self._wait_deleted(rev + 1)
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except LeaseNotFound:
                log.warning("election %s: lease %s gone; granting a new one", self.role, self._lease_id)
                if self._lease_id is not None:
                    self._drop_lease(self._lease_id, "lease not found")
            except Exception as e:
                log.warning("election %s: campaign error (retrying in %.1fs): %s", self.role, backoff, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, float(self.ttl_s))

    async def _wait_deleted(self, start_revision: int) -> None:
        async with contextlib.aclosing(self.client.watch_key(self.key, start_revision)) as events:
            async for batch in events:
                if any(ev.kind == "delete" for ev in batch):
                    return

    def _become_leader(self, mod_revision: int) -> None:
        self._is_leader = True
        self.terms += 1
        self.lost.clear()
        log.info("election %s: %s is leader (lease %x)", self.role, self.candidate_id, self._lease_id or 0)
        self._cancel(self._monitor)
        self._monitor = asyncio.create_task(
            self._watch_leadership(mod_revision + 1), name=f"leader:{self.key}"
        )

    def _lose(self, reason: str) -> None:
        if self._is_leader:
            self._is_leader = False
            log.warning("election %s: %s lost leadership: %s", self.role, self.candidate_id, reason)
            self.lost.set()
        monitor, self._monitor = self._monitor, None
        if monitor is not asyncio.current_task():
            self._cancel(monitor)

    async def _watch_leadership(self, start_revision: int) -> None:
        """While leader: lose leadership as soon as the key is deleted or overwritten."""
        backoff = 0.1
        rev = start_revision
        while self._is_leader:
            try:
                async with contextlib.aclosing(self.client.watch_key(self.key, rev)) as events:
                    async for batch in events:
                        backoff = 0.1
                        for ev in batch:
                            if ev.kind == "delete" or ev.value != self._value:
                                self._lose(f"leader key {ev.kind} at revision {ev.mod_revision}")
                                return
                            rev = ev.mod_revision + 1
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.debug("election %s: leadership watch interrupted: %s", self.role, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.interval_s)
                try:  # the watch may have missed changes (compaction): check the key itself
                    kv, cur = await self.client.get_kv(self.key)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    continue  # etcd still down: the keep-alive task enforces the TTL deadline
                if kv is None or kv.value != self._value or kv.lease != self._lease_id:
                    self._lose("leader key gone or taken while the watch was down")
                    return
                rev = cur + 1

    # -- lease -------------------------------------------------------------------------------------------
    async def _ensure_lease(self) -> int:
        if self._lease_id is None:
            sent = time.monotonic()
            lease = await self.client.grant(self.ttl_s)
            self._lease_id, self._last_refresh = lease, sent
            self._cancel(self._keepalive)
            self._keepalive = asyncio.create_task(self._keep_alive(lease), name=f"election-lease:{self.key}")
        return self._lease_id

    async def _keep_alive(self, lease: int) -> None:
        while self._lease_id == lease:
            await asyncio.sleep(self.interval_s)
            sent = time.monotonic()  # etcd renews no later than this: our deadline never trails its own
            try:
                ttl = await self.client.refresh(lease, timeout=self.interval_s)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if time.monotonic() - self._last_refresh > self.ttl_s:
                    self._drop_lease(lease, f"lease not refreshed for {self.ttl_s}s ({e})")
                    return
                log.warning("election %s: lease refresh failed: %s", self.role, e)
                continue
            if ttl <= 0:
                self._drop_lease(lease, "lease expired or revoked")
                return
            self._last_refresh = sent

    def _drop_lease(self, lease: int, reason: str) -> None:
        if self._lease_id != lease:
            return
        self._lease_id = None
        self._stale.add(lease)
        self._lose(reason)
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not asyncio.current_task():
            self._cancel(keepalive)
        self._spawn(self._revoke_quietly(lease))  # in case etcd still has it: free the key quickly

    async def _revoke_quietly(self, lease: int) -> None:
        try:
            await self.client.revoke(lease, timeout=2.0)
            self._stale.discard(lease)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.debug("election %s: revoke of lease %x failed: %s", self.role, lease, e)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    @staticmethod
    def _cancel(task: asyncio.Task[None] | None) -> None:
        if task is not None and not task.done():
            task.cancel()

    # -- resign / run ------------------------------------------------------------------------------------
    async def resign(self, timeout: float = 2.0) -> None:
        """Give up leadership (delete the key if still ours, revoke the lease); best effort, never raises."""
        was_leader = self._is_leader
        self._resigned = self._resigned or was_leader
        self._lose("resigned")
        lease, self._lease_id = self._lease_id, None
        keepalive, self._keepalive = self._keepalive, None
        self._cancel(keepalive)
        try:
            if was_leader:
                await self.client.delete_if_value(self.key, self._value, timeout=timeout)
            if lease is not None:
                await self.client.revoke(lease, timeout=timeout)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("election %s: resign incomplete (the lease will expire): %s", self.role, e)

    async def run(
        self, on_elected: Callable[[], Awaitable[None]], on_lost: Callable[[], Awaitable[None]]
    ) -> None:
        """Campaign forever: ``on_elected`` when elected, ``on_lost`` when leadership ends, then again.

        ``on_elected`` runs as a task that is cancelled if leadership is lost before it returns; if it
        raises, or :meth:`resign` is called, we re-campaign only after a pause of one TTL. Cancelling
        ``run`` calls ``on_lost`` (if leading) and resigns. Never raises on etcd outages.
        """
        leading = False
        try:
            while True:
                await self.campaign()
                leading = True
                failed = await self._lead(on_elected)
                leading = False
                await self._callback(on_lost, "on_lost")
                if failed or self._resigned:  # let another candidate take over first
                    self._resigned = False
                    await asyncio.sleep(self.ttl_s)
        finally:
            if leading:
                await self._callback(on_lost, "on_lost")
            await self.resign()

    async def _lead(self, on_elected: Callable[[], Awaitable[None]]) -> bool:
        """Run on_elected and wait for leadership to end; True if on_elected failed."""
        work = asyncio.ensure_future(on_elected())
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
            if work.done() and not work.cancelled() and work.exception() is not None:
                log.error("election %s: on_elected failed; resigning", self.role, exc_info=work.exception())
                await self.resign()
                return True
            await self.lost.wait()
            return False
        finally:
            lost.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work

    async def _callback(self, fn: Callable[[], Awaitable[None]], name: str) -> None:
        try:
            await fn()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("election %s: %s failed", self.role, name)
