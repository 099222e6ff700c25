"""EtcdClient: a small, retrying, reconnecting wrapper around ``aetcd.Client``.

aetcd supplies the gRPC channel, stubs and protobuf messages; the RPCs are issued on its stubs directly
so that every call gets a deadline, transient failures are retried (tenacity) and surface as
:class:`EtcdUnavailable`, watches keep etcd's per-revision batching, and a dead channel is replaced
(rotating through ``settings.endpoints``) so the client survives etcd being killed and restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple, TypeVar

import aetcd
import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from llmfleet.config import EtcdSettings
from llmfleet.coord.etcd_tls import new_aetcd_client
from llmfleet.coord.keys import Keys

log = logging.getLogger(__name__)

R = TypeVar("R")

_TRANSIENT_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

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


class EtcdError(Exception):
    """Base class of the coordination library's etcd errors."""


class EtcdUnavailable(EtcdError):
    """etcd could not be reached (or did not answer) within the configured timeout."""


class LeaseNotFound(EtcdError):
    """The lease does not exist (expired, revoked, or etcd lost its data)."""


class WatchInterrupted(EtcdError):
    """A watch ended (compaction, server cancel, stream error); re-list and watch again."""

    def __init__(self, message: str, compact_revision: int = 0) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class WatchEvent(NamedTuple):
    """One change: ``kind`` is 'put' or 'delete'; for deletes ``value`` is b""."""

    kind: Literal["put", "delete"]
    key: str
    value: bytes
    mod_revision: int


@dataclass(frozen=True)
class KeyValue:
    """A key's full record as etcd stores it (``lease`` is 0 when unbound)."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


def _rpc_error(e: BaseException) -> grpc.aio.AioRpcError | None:
    seen: BaseException | None = e
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, grpc.aio.AioRpcError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def is_transient(e: BaseException) -> bool:
    """True for errors worth retrying: connection trouble, timeouts, a channel closed under us."""
    if isinstance(e, EtcdUnavailable | ConnectionError | OSError | grpc.aio.UsageError):
        return True  # (TimeoutError is an OSError)
    if isinstance(e, aetcd.ConnectionFailedError | aetcd.ConnectionTimeoutError):
        return True
    err = _rpc_error(e)
    return err is not None and err.code() in _TRANSIENT_CODES


def _is_connection_failure(e: BaseException) -> bool:
    """Transport-level failure (as opposed to an etcd server answering 'etcdserver: ...')."""
    err = _rpc_error(e)
    if err is None:
        return isinstance(e, ConnectionError | OSError | grpc.aio.UsageError)
    if err.code() == grpc.StatusCode.UNAVAILABLE:
        return not (err.details() or "").startswith("etcdserver:")
    return err.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN)


def _describe(e: BaseException) -> str:
    err = _rpc_error(e)
    return f"{err.code().name}: {err.details()}" if err is not None else f"{type(e).__name__}: {e}"


def _grpc_cancelled() -> bool:
    """True if a CancelledError did not come from cancelling the current task: grpc.aio raises
    CancelledError in the awaiting task when a call is cancelled locally (e.g. its channel closed)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


def _translate(e: BaseException) -> BaseException:
    err = _rpc_error(e)
    if (
        err is not None
        and err.code() == grpc.StatusCode.NOT_FOUND
        and "lease not found" in (err.details() or "")
    ):
        return LeaseNotFound(err.details())
    return e


def _kv(kv: rpc.KeyValue) -> KeyValue:
    return KeyValue(
        key=kv.key.decode(),
        value=bytes(kv.value),
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        version=kv.version,
        lease=kv.lease,
    )


def _split_endpoint(ep: str) -> tuple[str, int]:
    ep = ep.removeprefix("http://").removeprefix("https://").rstrip("/")
    host, _, port = ep.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"etcd endpoint must be host:port, got {ep!r}")
    return host, int(port)


class EtcdClient:
    """Async etcd client for llmfleet's coordination keys (all keys/values as str/bytes)."""

    def __init__(self, settings: EtcdSettings) -> None:
        if not settings.endpoints:
            raise ValueError("EtcdSettings.endpoints is empty")
        self.settings = settings
        self.keys = Keys(settings.prefix)
        self._endpoints = [_split_endpoint(e) for e in settings.endpoints]
        self._idx = 0
        self._client: aetcd.Client | None = None
        self._gen = 0
        self._healthy = False
        self._closed = False
        self._lock = asyncio.Lock()
        self._bg: set[asyncio.Task[None]] = set()

    # -- connection management ---------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """True once connected and while the last RPC succeeded (or failed for a non-transport reason)."""
        return self._client is not None and self._healthy and not self._closed

    @property
    def endpoint(self) -> str:
        host, port = self._endpoints[self._idx]
        return f"{host}:{port}"

    def _new_client(self, idx: int) -> aetcd.Client:
        host, port = self._endpoints[idx]
        return new_aetcd_client(self.settings, host, port, dict(_CHANNEL_OPTIONS))

    async def _current(self) -> tuple[aetcd.Client, int]:
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

    def _on_failure(self, gen: int, e: BaseException) -> None:
        """After a transport failure, drop the channel (once per generation) and move to the next endpoint."""
        self._healthy = False
        if gen != self._gen or self._client is None:
            return
        err = _rpc_error(e)
        timed_out = err is not None and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        if not (_is_connection_failure(e) or (timed_out and len(self._endpoints) > 1)):
            return  # etcd answered (e.g. "etcdserver: leader changed"): keep the channel
        old, self._client = self._client, None
        self._idx = (self._idx + 1) % len(self._endpoints)
        log.debug("etcd channel failed (%s); reconnecting to %s", _describe(e), self.endpoint)
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
                err = _rpc_error(e)
                host, port = self._endpoints[idx]
                errors.append(f"{host}:{port}: {err.details() if err else e}")
                continue
            old, self._client = self._client, client
            self._idx, self._gen, self._healthy = idx, self._gen + 1, True
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
        self._healthy = False
        client, self._client = self._client, None
        if client is not None:
            await self._close_quietly(client)
        for t in list(self._bg):
            t.cancel()  # closes the replaced channels now
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def __aenter__(self) -> EtcdClient:
        await self.connect(wait=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- retrying call helper ----------------------------------------------------------------------------
    async def _call(
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
                    client, gen = await self._current()
                    try:
                        try:
                            result = await fn(client, max(0.2, deadline - time.monotonic()))
                        except asyncio.CancelledError as e:
                            if not _grpc_cancelled():
                                raise
                            raise ConnectionError("etcd call cancelled: its channel was closed") from e
                    except Exception as e:
                        if is_transient(e):
                            self._on_failure(gen, e)
                        translated = _translate(e)
                        if translated is e:
                            raise
                        raise translated from e
                    self._healthy = True
                    return result
        except EtcdError:
            raise
        except Exception as e:
            if is_transient(e):
                raise EtcdUnavailable(
                    f"etcd {what} failed for {budget:.1f}s at {self.endpoint}: {_describe(e)}"
                ) from e
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    # -- KV ----------------------------------------------------------------------------------------------
    async def put(
        self, key: str, value: bytes, lease: int | None = None, *, timeout: float | None = None
    ) -> int:
        """Put ``key`` (optionally bound to ``lease``); returns the new revision. LeaseNotFound if gone."""
        req = rpc.PutRequest(key=key.encode(), value=value, lease=lease or 0)

        async def op(c: aetcd.Client, t: float) -> int:
            return (await c.kvstub.Put(req, timeout=t, metadata=c.metadata)).header.revision

        return await self._call(f"put {key}", op, timeout)

    async def get_kv(self, key: str, *, timeout: float | None = None) -> tuple[KeyValue | None, int]:
        """The key's full record (or None) and the store revision of the read."""
        req = rpc.RangeRequest(key=key.encode())

        async def op(c: aetcd.Client, t: float) -> tuple[KeyValue | None, int]:
            resp = await c.kvstub.Range(req, timeout=t, metadata=c.metadata)
            return (_kv(resp.kvs[0]) if resp.kvs else None), resp.header.revision

        return await self._call(f"get {key}", op, timeout)

    async def get(self, key: str, *, timeout: float | None = None) -> bytes | None:
        kv, _ = await self.get_kv(key, timeout=timeout)
        return kv.value if kv is not None else None

    async def get_prefix(
        self, prefix: str, revision: int | None = None, *, timeout: float | None = None
    ) -> tuple[dict[str, bytes], int]:
        """All keys under ``prefix`` (full key -> value) and the revision they were read at.

        ``revision`` reads a historical revision (fails if compacted)."""
        p = prefix.encode()
        req = rpc.RangeRequest(key=p, range_end=prefix_range_end(p), revision=revision or 0)

        async def op(c: aetcd.Client, t: float) -> tuple[dict[str, bytes], int]:
            resp = await c.kvstub.Range(req, timeout=t, metadata=c.metadata)
            return {kv.key.decode(): bytes(kv.value) for kv in resp.kvs}, resp.header.revision

        return await self._call(f"get_prefix {prefix}", op, timeout)

    async def delete(self, key: str, *, timeout: float | None = None) -> bool:
        """Delete ``key``; True if it existed."""
        req = rpc.DeleteRangeRequest(key=key.encode())

        async def op(c: aetcd.Client, t: float) -> bool:
            return (await c.kvstub.DeleteRange(req, timeout=t, metadata=c.metadata)).deleted > 0

        return await self._call(f"delete {key}", op, timeout)

    async def _txn(self, what: str, req: rpc.TxnRequest, timeout: float | None) -> bool:
        async def op(c: aetcd.Client, t: float) -> bool:
            return bool((await c.kvstub.Txn(req, timeout=t, metadata=c.metadata)).succeeded)

        return await self._call(what, op, timeout)

    async def put_if_absent(
        self, key: str, value: bytes, lease: int | None = None, *, timeout: float | None = None
    ) -> bool:
        """Create ``key`` only if it does not exist (txn on create_revision == 0); True if created."""
        k = key.encode()
        req = rpc.TxnRequest(
            compare=[
                rpc.Compare(key=k, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0)
            ],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=k, value=value, lease=lease or 0))],
        )
        return await self._txn(f"put_if_absent {key}", req, timeout)

    async def delete_if_value(self, key: str, value: bytes, *, timeout: float | None = None) -> bool:
        """Delete ``key`` only if it currently holds ``value``; True if deleted."""
        k = key.encode()
        req = rpc.TxnRequest(
            compare=[rpc.Compare(key=k, target=rpc.Compare.VALUE, result=rpc.Compare.EQUAL, value=value)],
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=k))],
        )
        return await self._txn(f"delete_if_value {key}", req, timeout)

    async def compact(self, revision: int, *, timeout: float | None = None) -> None:
        """Compact history below ``revision`` (watches from older revisions then fail)."""
        req = rpc.CompactionRequest(revision=revision, physical=True)

        async def op(c: aetcd.Client, t: float) -> None:
            await c.kvstub.Compact(req, timeout=t, metadata=c.metadata)

        await self._call("compact", op, timeout)

    # -- leases ------------------------------------------------------------------------------------------
    async def grant(self, ttl: int, *, timeout: float | None = None) -> int:
        """Grant a lease of ``ttl`` seconds; returns its id."""
        req = rpc.LeaseGrantRequest(TTL=ttl)

        async def op(c: aetcd.Client, t: float) -> int:
            resp = await c.leasestub.LeaseGrant(req, timeout=t, metadata=c.metadata)
            if resp.error:
                raise EtcdError(f"lease grant failed: {resp.error}")
            return int(resp.ID)

        return await self._call("grant", op, timeout)

    async def refresh(self, lease_id: int, *, timeout: float | None = None) -> int:
        """Send one keep-alive; returns the renewed TTL, <= 0 if the lease no longer exists."""

        async def op(c: aetcd.Client, t: float) -> int:
            call = c.leasestub.LeaseKeepAlive(timeout=t, metadata=c.metadata)
            try:
                await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    raise ConnectionError("lease keep-alive stream closed by etcd")
                return int(resp.TTL)
            finally:
                call.cancel()

        return await self._call("refresh", op, timeout)

    async def lease_ttl(self, lease_id: int, *, timeout: float | None = None) -> int:
        """Remaining TTL in seconds, -1 if the lease does not exist."""
        req = rpc.LeaseTimeToLiveRequest(ID=lease_id, keys=False)

        async def op(c: aetcd.Client, t: float) -> int:
            return int((await c.leasestub.LeaseTimeToLive(req, timeout=t, metadata=c.metadata)).TTL)

        return await self._call("lease_ttl", op, timeout)

    async def revoke(self, lease_id: int, *, timeout: float | None = None) -> bool:
        """Revoke a lease (its keys are deleted); False if it did not exist."""
        req = rpc.LeaseRevokeRequest(ID=lease_id)

        async def op(c: aetcd.Client, t: float) -> None:
            await c.leasestub.LeaseRevoke(req, timeout=t, metadata=c.metadata)

        try:
            await self._call("revoke", op, timeout)
        except LeaseNotFound:
            return False
        return True

    # -- watches -----------------------------------------------------------------------------------------
    def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        """Events under ``prefix`` from ``start_revision`` (inclusive), one list per etcd revision.

        Never ends normally: raises :class:`WatchInterrupted` on compaction / server cancel / stream close
        and :class:`EtcdUnavailable` on connection loss; callers then re-list and watch again.
        Use with ``contextlib.aclosing`` (or ``break``) so the stream is released.
        """
        p = prefix.encode()
        return self._watch(p, prefix_range_end(p), start_revision)

    def watch_key(self, key: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        """Like :meth:`watch_prefix` for exactly one key."""
        return self._watch(key.encode(), b"", start_revision)

    async def _watch_io(self, aw: Awaitable[R], gen: int, what: str) -> R:
        """Await one step of a watch stream, mapping transport trouble to EtcdUnavailable."""
        try:
            try:
                return await aw
            except asyncio.CancelledError as e:
                if not _grpc_cancelled():
                    raise
                raise ConnectionError("watch cancelled: its channel was closed") from e
        except Exception as e:
            if is_transient(e):
                self._on_failure(gen, e)
                raise EtcdUnavailable(f"etcd {what} at {self.endpoint}: {_describe(e)}") from e
            raise

    async def _watch(
        self, key: bytes, range_end: bytes, start_revision: int
    ) -> AsyncIterator[list[WatchEvent]]:
        name = key.decode()
        client, gen = await self._current()
        create = rpc.WatchCreateRequest(key=key, range_end=range_end, start_revision=max(start_revision, 0))
        metadata = (*(client.metadata or ()), ("hasleader", "true"))
        call = rpc.WatchStub(client.channel).Watch(metadata=metadata)
        try:
            await self._watch_io(
                call.write(rpc.WatchRequest(create_request=create)), gen, f"watch {name!r} failed"
            )
            resp = await self._watch_io(
                asyncio.wait_for(call.read(), self.settings.timeout_s), gen, f"watch {name!r} failed"
            )
            while True:
                if resp is grpc.aio.EOF:
                    raise WatchInterrupted(f"watch on {name!r} closed by etcd")
                if resp.compact_revision:
                    raise WatchInterrupted(
                        f"watch on {name!r} from revision {start_revision}: history compacted "
                        f"up to {resp.compact_revision}",
                        compact_revision=resp.compact_revision,
                    )
                if resp.canceled:
                    raise WatchInterrupted(f"watch on {name!r} canceled by etcd: {resp.cancel_reason}")
                self._healthy = True
                batch: list[WatchEvent] = []
                for ev in resp.events:  # etcd never splits one revision across responses (fragment=False)
                    rev = ev.kv.mod_revision
                    if batch and batch[0].mod_revision != rev:
                        yield batch
                        batch = []
                    if ev.type == rpc.Event.PUT:
                        batch.append(WatchEvent("put", ev.kv.key.decode(), bytes(ev.kv.value), rev))
                    else:
                        batch.append(WatchEvent("delete", ev.kv.key.decode(), b"", rev))
                if batch:
                    yield batch
                resp = await self._watch_io(call.read(), gen, f"watch {name!r} lost")
        finally:
            call.cancel()
