"""The etcd client's channel: connect to the first answering endpoint, replace a dead channel
(rotating through ``settings.endpoints``), and run one call with a deadline, retrying transient
failures (tenacity) until they surface as :class:`EtcdUnavailable`.

aetcd supplies the gRPC channel, stubs and protobuf messages; :class:`EtcdConnection` owns the
current ``aetcd.Client`` and its generation, so that a failure seen on a channel already replaced
does not drop the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aetcd
import grpc
from aetcd import rpc
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from llmfleet.config import EtcdSettings
from llmfleet.coord.etcd_errors import (
    EtcdError,
    EtcdUnavailable,
    describe,
    grpc_cancelled,
    is_connection_failure,
    is_transient,
    rpc_error,
    translate,
)
from llmfleet.coord.etcd_tls import new_aetcd_client

log = logging.getLogger(__name__)

R = TypeVar("R")

_DISCARD_GRACE_S = 2.0  # a replaced channel is closed this long after (closing cancels calls still on it)

# gRPC channel options: reconnect quickly after etcd restarts; detect dead peers via HTTP/2 keepalive
# (etcd's default --grpc-keepalive-min-time is 5 s and it rejects pings without active streams).
_CHANNEL_OPTIONS: dict[str, int] = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 0,
    "grpc.max_receive_message_length": 64 * 1024 * 1024,
}


def split_endpoint(ep: str) -> tuple[str, int]:
    """``http://host:port`` / ``host:port`` -> ``(host, port)`` (ValueError when it is neither)."""
    ep = ep.removeprefix("http://").removeprefix("https://").rstrip("/")
    host, _, port = ep.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"etcd endpoint must be host:port, got {ep!r}")
    return host, int(port)


async def _uncancelled(aw: Awaitable[R], what: str) -> R:
    """``await aw``, with the CancelledError grpc.aio raises when the call's channel is closed under
    it (not a cancel of this task) turned into a ConnectionError, which is retried."""
    try:
        return await aw
    except asyncio.CancelledError as e:
        if not grpc_cancelled():
            raise
        raise ConnectionError(f"{what} cancelled: its channel was closed") from e


class EtcdConnection:
    """The channel to one of ``settings.endpoints`` (opened lazily), replaced after a transport
    failure; ``healthy`` is True while the last call succeeded (or failed for a non-transport reason)."""

    def __init__(self, settings: EtcdSettings) -> None:
        if not settings.endpoints:
            raise ValueError("EtcdSettings.endpoints is empty")
        self.settings = settings
        self._endpoints = [split_endpoint(e) for e in settings.endpoints]
        self._idx = 0
        self._client: aetcd.Client | None = None
        self._gen = 0
        self.healthy = False
        self._closed = False
        self._lock = asyncio.Lock()
        self._bg: set[asyncio.Task[None]] = set()

    @property
    def connected(self) -> bool:
        """True once connected and while the last RPC succeeded (or failed for a non-transport reason)."""
        return self._client is not None and self.healthy and not self._closed

    @property
    def endpoint(self) -> str:
        host, port = self._endpoints[self._idx]
        return f"{host}:{port}"

    def _new_client(self, idx: int) -> aetcd.Client:
        host, port = self._endpoints[idx]
        return new_aetcd_client(self.settings, host, port, dict(_CHANNEL_OPTIONS))

    async def current(self) -> tuple[aetcd.Client, int]:
        """The channel calls go on now (opened on first use) and its generation."""
        if self._closed:
            raise EtcdError("EtcdClient is closed")
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    c = self._new_client(self._idx)
                    await c.connect()  # aetcd only builds the channel and stubs here; no I/O
                    self._client = c
                    self._gen += 1
        assert self._client is not None
        return self._client, self._gen

    def _discard(self, client: aetcd.Client) -> None:
        """Close a replaced channel after a grace period, so calls still on it end on their own."""
        task = asyncio.get_running_loop().create_task(self._close_later(client))
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _close_later(self, client: aetcd.Client) -> None:
        try:
            await asyncio.sleep(_DISCARD_GRACE_S)
        finally:
            await self._close_quietly(client)

    @staticmethod
    async def _close_quietly(client: aetcd.Client) -> None:
        with contextlib.suppress(Exception):
            await client.close()

    def on_failure(self, gen: int, e: BaseException) -> None:
        """After a transport failure, drop the channel (once per generation) and move to the next endpoint."""
        self.healthy = False
        if gen != self._gen or self._client is None:
            return
        err = rpc_error(e)
        timed_out = err is not None and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        if not (is_connection_failure(e) or (timed_out and len(self._endpoints) > 1)):
            return  # etcd answered (e.g. "etcdserver: leader changed"): keep the channel
        old, self._client = self._client, None
        self._idx = (self._idx + 1) % len(self._endpoints)
        log.debug("etcd channel failed (%s); reconnecting to %s", describe(e), self.endpoint)
        self._discard(old)

    async def _probe(self, client: aetcd.Client, timeout: float) -> None:
        await client.connect()
        await client.maintenancestub.Status(rpc.StatusRequest(), timeout=timeout, metadata=client.metadata)

    async def _connect_once(self) -> None:
        errors: list[str] = []
        n = len(self._endpoints)
        for i in range(n):
            idx = (self._idx + i) % n
            client = self._new_client(idx)
            try:
                await self._probe(client, min(self.settings.timeout_s, 2.0))
            except Exception as e:
                await self._close_quietly(client)
                err = rpc_error(e)
                host, port = self._endpoints[idx]
                errors.append(f"{host}:{port}: {err.details() if err else e}")
                continue
            old, self._client = self._client, client
            self._idx, self._gen, self.healthy = idx, self._gen + 1, True
            if old is not None:
                self._discard(old)
            log.info("connected to etcd at %s", self.endpoint)
            return
        raise EtcdUnavailable("etcd unreachable at " + "; ".join(errors))

    async def connect(self, wait: bool = True) -> None:
        """Connect to the first answering endpoint.

        ``wait=True`` retries forever with exponential backoff (max 5 s), logging a warning each time;
        ``wait=False`` tries every endpoint once and raises :class:`EtcdUnavailable`.
        """
        if self._closed:
            raise EtcdError("EtcdClient is closed")
        if not wait:
            await self._connect_once()
            return
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(EtcdUnavailable),
            wait=wait_exponential(multiplier=0.1, min=0.1, max=5.0),
            before_sleep=lambda s: log.warning(
                "etcd unreachable at %s, retrying in %.1fs (attempt %d): %s",
                ",".join(self.settings.endpoints),
                s.next_action.sleep if s.next_action else 0.0,
                s.attempt_number,
                s.outcome.exception() if s.outcome else None,
            ),
        ):
            with attempt:
                await self._connect_once()

    async def close(self) -> None:
        self._closed = True
        self.healthy = False
        client, self._client = self._client, None
        if client is not None:
            await self._close_quietly(client)
        for t in list(self._bg):
            t.cancel()  # closes the replaced channels now
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _attempt(self, fn: Callable[[aetcd.Client, float], Awaitable[R]], deadline: float) -> R:
        """One try of ``fn`` on the current channel; a transport failure drops that channel."""
        client, gen = await self.current()
        try:
            result = await _uncancelled(fn(client, max(0.2, deadline - time.monotonic())), "etcd call")
        except Exception as e:
            if is_transient(e):
                self.on_failure(gen, e)
            translated = translate(e)
            if translated is e:
                raise
            raise translated from e
        self.healthy = True
        return result

    async def call(
        self, what: str, fn: Callable[[aetcd.Client, float], Awaitable[R]], timeout: float | None = None
    ) -> R:
        """Run ``fn(client, attempt_timeout)``, retrying transient errors for ``timeout`` (default
        ``settings.timeout_s``), then raise :class:`EtcdUnavailable`."""
        budget = timeout if timeout is not None else self.settings.timeout_s
        deadline = time.monotonic() + budget
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_delay(budget),
                wait=wait_exponential(multiplier=0.05, min=0.05, max=1.0),
                retry=retry_if_exception(is_transient),
                reraise=True,
            ):
                with attempt:
                    return await self._attempt(fn, deadline)
        except EtcdError:
            raise
        except Exception as e:
            if is_transient(e):
                raise EtcdUnavailable(
                    f"etcd {what} failed for {budget:.1f}s at {self.endpoint}: {describe(e)}"
                ) from e
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def guard(self, aw: Awaitable[R], gen: int, what: str) -> R:
        """Await one step of a stream on channel generation ``gen``, mapping transport trouble to
        :class:`EtcdUnavailable` (and dropping that channel)."""
        try:
            return await _uncancelled(aw, "watch")
        except Exception as e:
            if is_transient(e):
                self.on_failure(gen, e)
                raise EtcdUnavailable(f"etcd {what} at {self.endpoint}: {describe(e)}") from e
            raise
