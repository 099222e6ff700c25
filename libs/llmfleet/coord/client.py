"""EtcdClient: a small, retrying, reconnecting wrapper around ``aetcd.Client``.

aetcd supplies the gRPC channel, stubs and protobuf messages; the RPCs are issued on its stubs directly
so that every call gets a deadline, transient failures are retried (tenacity) and surface as
:class:`EtcdUnavailable`, watches keep etcd's per-revision batching, and a dead channel is replaced
(rotating through ``settings.endpoints``) so the client survives etcd being killed and restarted.

The channel and the retrying call live in :mod:`llmfleet.coord.connection`, watches in
:mod:`llmfleet.coord.watch`, the errors in :mod:`llmfleet.coord.etcd_errors`; this module has the
key-value and lease operations, and re-exports the errors and records callers import from here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import aetcd
import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end

from llmfleet.config import EtcdSettings
from llmfleet.coord.connection import EtcdConnection
from llmfleet.coord.etcd_errors import (
    EtcdError,
    EtcdUnavailable,
    LeaseNotFound,
    WatchInterrupted,
    is_transient,
)
from llmfleet.coord.keys import Keys
from llmfleet.coord.records import KeyValue, WatchEvent
from llmfleet.coord.watch import watch_events

__all__ = [
    "EtcdClient",
    "EtcdError",
    "EtcdUnavailable",
    "KeyValue",
    "LeaseNotFound",
    "WatchEvent",
    "WatchInterrupted",
    "is_transient",
]

R = TypeVar("R")


class EtcdClient:
    """Async etcd client for llmfleet's coordination keys (all keys/values as str/bytes)."""

    def __init__(self, settings: EtcdSettings) -> None:
        self._conn = EtcdConnection(settings)  # ValueError when settings.endpoints is empty
        self.settings = settings
        self.keys = Keys(settings.prefix)

    # -- connection management ---------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """True once connected and while the last RPC succeeded (or failed for a non-transport reason)."""
        return self._conn.connected

    @property
    def endpoint(self) -> str:
        return self._conn.endpoint

    async def connect(self, wait: bool = True) -> None:
        """Connect to the first answering endpoint.

        ``wait=True`` retries forever with exponential backoff (max 5 s), logging a warning each time;
        ``wait=False`` tries every endpoint once and raises :class:`EtcdUnavailable`.
        """
        await self._conn.connect(wait)

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> EtcdClient:
        await self.connect(wait=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(
        self, what: str, fn: Callable[[aetcd.Client, float], Awaitable[R]], timeout: float | None = None
    ) -> R:
        return await self._conn.call(what, fn, timeout)

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
            return (KeyValue.from_proto(resp.kvs[0]) if resp.kvs else None), resp.header.revision

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

    async def txn(self, what: str, req: rpc.TxnRequest, timeout: float | None) -> bool:
        """Run the transaction ``req`` (``what`` names it in errors); True if its comparisons held."""

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
        return await self.txn(f"put_if_absent {key}", req, timeout)

    async def delete_if_value(self, key: str, value: bytes, *, timeout: float | None = None) -> bool:
        """Delete ``key`` only if it currently holds ``value``; True if deleted."""
        k = key.encode()
        req = rpc.TxnRequest(
            compare=[rpc.Compare(key=k, target=rpc.Compare.VALUE, result=rpc.Compare.EQUAL, value=value)],
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=k))],
        )
        return await self.txn(f"delete_if_value {key}", req, timeout)

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
        return watch_events(self._conn, p, prefix_range_end(p), start_revision)

    def watch_key(self, key: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        """Like :meth:`watch_prefix` for exactly one key."""
        return watch_events(self._conn, key.encode(), b"", start_revision)
