"""Registration: keep one key bound to a live lease, forever (re-grant and re-put whenever it is lost)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from llmfleet.coord.client import EtcdClient, LeaseNotFound

log = logging.getLogger(__name__)


class Registration:
    """Publish ``key`` = ``value()`` bound to a lease that a background task keeps alive.

    The task refreshes the lease every ttl/3 and checks the key is still there. When the lease is lost
    (revoked, expired during an etcd outage or a network cut, or etcd lost its data) it grants a new one
    and puts the key again; if the key alone vanished it is put again on the same lease. Errors are
    logged, never raised. ``registered`` is set while the key is believed to be in etcd.
    """

    def __init__(
        self, client: EtcdClient, key: str, value: Callable[[], bytes], ttl_s: int | None = None
    ) -> None:
        self.client = client
        self.key = key
        self.value = value
        self.ttl_s = int(ttl_s or client.settings.lease_ttl_s)
        self.registered = asyncio.Event()
        self.reregistrations = 0
        self._lease_id: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._dirty = False
        self._lock = asyncio.Lock()
        self._last_ok = 0.0
        self._registrations = 0
        self.on_lost: Callable[[], None] | None = None  # called when a held lease is lost (metrics)

    @property
    def lease_id(self) -> int | None:
        """The lease the key is bound to (None before the first registration / after it was lost)."""
        return self._lease_id

    @property
    def interval_s(self) -> float:
        return max(self.ttl_s / 3.0, 0.2)

    @property
    def running(self) -> bool:
        """The background task is alive: started, not stopped, never crashed."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Start the background task and return at once."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"registration:{self.key}")

    async def wait_registered(self, timeout: float) -> None:
        """Wait until the key is registered; TimeoutError otherwise."""
        try:
            await asyncio.wait_for(self.registered.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"{self.key} not registered within {timeout}s") from None

    async def update(self) -> None:
        """Re-put the current ``value()`` (best effort; on failure the background task retries)."""
        self._dirty = True
        lease = self._lease_id
        if lease is not None and not self._lock.locked():  # else the task is (re-)putting value() anyway
            try:
                async with self._lock:
                    if self._lease_id == lease:
                        await self._put(lease)
                        return
            except LeaseNotFound:
                log.warning("registration %s: lease %x lost during update; re-registering", self.key, lease)
                self._lost()
            except Exception as e:
                log.warning("registration %s: update failed (will retry): %s", self.key, e)
        self._wake.set()

    async def stop(self, timeout: float = 2.0) -> None:
        """Stop the task and revoke the lease best-effort, so the key disappears at once."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        lease, self._lease_id = self._lease_id, None
        self.registered.clear()
        if lease is not None:
            try:
                await self.client.revoke(lease, timeout=timeout)
            except Exception as e:
                log.warning("registration %s: could not revoke lease %x on stop: %s", self.key, lease, e)

    async def _put(self, lease: int) -> None:
        self._dirty = False  # cleared before value() is read, so a concurrent update() is never lost
        try:
            await self.client.put(self.key, self.value(), lease=lease)
        except BaseException:
            self._dirty = True
            raise

    def _lost(self) -> None:
        if self._lease_id is not None and self.on_lost is not None:
            try:
                self.on_lost()
            except Exception:
                log.exception("registration %s: on_lost hook failed", self.key)
        self._lease_id = None
        self.registered.clear()

    async def _register(self) -> None:
        async with self._lock:
            lease = await self.client.grant(self.ttl_s)
            try:
                await self._put(lease)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.client.revoke(lease, timeout=1.0)
                raise
            self._lease_id = lease
        self._last_ok = time.monotonic()
        self._registrations += 1
        if self._registrations > 1:
            self.reregistrations += 1
            log.warning("registration %s: re-registered with lease %x", self.key, lease)
        else:
            log.info("registration %s: registered with lease %x (ttl %ds)", self.key, lease, self.ttl_s)
        self.registered.set()

    async def _keep(self, lease: int) -> None:
        ttl = await self.client.refresh(lease, timeout=self.interval_s)
        if ttl <= 0:
            log.warning("registration %s: lease %x lost; re-registering", self.key, lease)
            self._lost()
            return
        self._last_ok = time.monotonic()
        async with self._lock:
            if self._lease_id != lease:
                return
            if self._dirty:
                await self._put(lease)
            elif await self.client.get(self.key, timeout=self.interval_s) is None:
                log.warning(
                    "registration %s: key vanished while lease %x is alive; re-putting", self.key, lease
                )
                await self._put(lease)
        self.registered.set()

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                if self._lease_id is None:
                    await self._register()
                else:
                    await self._keep(self._lease_id)
                backoff = 0.1
                if self._lease_id is None:
                    continue  # lost: re-register right away
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval_s)
                self._wake.clear()
            except asyncio.CancelledError:
                raise
            except LeaseNotFound:
                log.warning("registration %s: lease %s not found; re-registering", self.key, self._lease_id)
                self._lost()
            except Exception as e:
                if self._lease_id is not None and time.monotonic() - self._last_ok > self.ttl_s:
                    # We could not refresh for a whole TTL: the lease has most likely expired.
                    self.registered.clear()
                log.warning("registration %s: etcd error (retrying in %.1fs): %s", self.key, backoff, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.interval_s)
