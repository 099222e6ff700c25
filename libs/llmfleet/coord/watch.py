"""etcd watches on an :class:`~llmfleet.coord.connection.EtcdConnection`: one list of
:class:`WatchEvent` per etcd revision (etcd's own batching is kept), and :class:`WatchInterrupted` /
:class:`EtcdUnavailable` when the stream ends, so callers re-list and watch again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import grpc
from aetcd import rpc

from llmfleet.coord.connection import EtcdConnection
from llmfleet.coord.etcd_errors import WatchInterrupted
from llmfleet.coord.records import WatchEvent


def _check(resp: rpc.WatchResponse, name: str, start_revision: int) -> None:
    """Raise :class:`WatchInterrupted` when ``resp`` ends the watch (stream closed, history
    compacted, cancelled by etcd)."""
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


def _batches(events: Iterable[rpc.Event]) -> Iterable[list[WatchEvent]]:
    """A response's events, one list per revision."""
    batch: list[WatchEvent] = []
    for ev in events:  # etcd never splits one revision across responses (fragment=False)
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


async def watch_events(
    conn: EtcdConnection, key: bytes, range_end: bytes, start_revision: int
) -> AsyncIterator[list[WatchEvent]]:
    """Events on ``key`` (up to ``range_end``, b"": the key alone) from ``start_revision``
    (inclusive), one list per etcd revision; never ends normally."""
    name = key.decode()
    client, gen = await conn.current()
    create = rpc.WatchCreateRequest(key=key, range_end=range_end, start_revision=max(start_revision, 0))
    metadata = (*(client.metadata or ()), ("hasleader", "true"))
    call = rpc.WatchStub(client.channel).Watch(metadata=metadata)
    try:
        await conn.guard(call.write(rpc.WatchRequest(create_request=create)), gen, f"watch {name!r} failed")
        resp = await conn.guard(
            asyncio.wait_for(call.read(), conn.settings.timeout_s), gen, f"watch {name!r} failed"
        )
        while True:
            _check(resp, name, start_revision)
            conn.healthy = True
            for batch in _batches(resp.events):
                yield batch
            resp = await conn.guard(call.read(), gen, f"watch {name!r} lost")
    finally:
        call.cancel()
