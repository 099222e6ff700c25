"""The front's calls to the schedulers: one channel per scheduler replica and, on it, one multiplexed
``SubmitMany`` call per API key (a :class:`llmfleet.rpc.mux.MuxLink`), opened by the key's first
request and kept while it is used.

Why one call per key: the scheduler authenticates a ``SubmitMany`` call once, from its
``authorization`` metadata, and applies that key's rate limits, quotas, service list and
``max_priority`` to every request on it, exactly as for an SDK caller (which also has one call per
client and replica). ``SubmitRequest`` carries no key, so a per-request key would need a protocol
change and a second place where the scheduler authenticates; a call per key needs neither, and a
front serving many requests of few keys keeps the SDK's cost per request (its streams share calls).
A key's call that the scheduler refuses (``UNAUTHENTICATED``) fails only that key's streams."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import grpc
from llmfleet.api.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.mux import SUBMIT_MANY, MuxLink, MuxStream
from llmfleet.security import SecuritySettings

_BACKGROUND: set[asyncio.Future] = set()  # idle calls being closed
SKIP_S = 5.0  # how long a replica found unavailable is left out (the SDK's spread does the same)
MAX_IDLE_LINKS = 256  # idle per-key calls kept open beyond this many are closed, least recently used first


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


@dataclass
class SchedulerLinks:
    """Requests go round-robin over the replicas ``addresses()`` names now (a fixed list, or the
    schedulers registered in etcd), skipping one that failed in the last :data:`SKIP_S` seconds.
    ``security``: TLS of the channels (the key travels per call, never on the channel). ``on_call``
    hears of each ``SubmitMany`` call: True when it opens, False when it ends (the front's metrics)."""

    addresses: Callable[[], Sequence[str]]
    security: SecuritySettings
    on_call: Callable[[bool], None] | None = None
    max_idle_links: int = MAX_IDLE_LINKS
    _channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)
    _links: OrderedDict[tuple[str, str], MuxLink] = field(default_factory=OrderedDict)
    _down: dict[str, float] = field(default_factory=dict)
    _rr: int = 0

    def __post_init__(self) -> None:
        self.security = replace(self.security, api_key=None)

    def pick(self) -> str | None:
        """The replica for the next request (None: no scheduler is known)."""
        addresses = list(self.addresses())
        if not addresses:
            return None
        now, n = time.monotonic(), len(addresses)
        for _ in range(n):
            address = addresses[self._rr % n]
            self._rr += 1
            if self._down.get(address, 0.0) <= now:
                return address
        return addresses[self._rr % n]  # every replica failed lately: try them in turn anyway

    def failed(self, address: str) -> None:
        """``address`` was unavailable: leave it out for a while."""
        self._down[address] = time.monotonic() + SKIP_S

    def open(
        self, address: str, token: str | None, request: scheduler_pb2.SubmitRequest, timeout_s: float | None
    ) -> MuxStream:
        """Start ``request`` on ``token``'s call to ``address`` (opened now if it is not open)."""
        key = (address, token or "")
        link = self._links.get(key)
        if link is None:
            stub = scheduler_pb2_grpc.SchedulerStub(self._channel(address))
            metadata = bearer_metadata(token)
            link = MuxLink(
                lambda: stub.SubmitMany(metadata=metadata),
                scheduler_pb2.SubmitCommands,
                SUBMIT_MANY,
                name=f"scheduler {address}",
                on_call=self.on_call,
            )
            self._links[key] = link
            self._trim()
        else:
            self._links.move_to_end(key)
        return link.open(request.request_id, request, timeout_s)

    async def cancel(self, address: str, token: str | None, request_id: str, timeout_s: float = 5.0) -> bool:
        """Cancel ``request_id`` on ``address`` now (not only stop following it)."""
        stub = scheduler_pb2_grpc.SchedulerStub(self._channel(address))
        resp = await stub.Cancel(
            common_pb2.CancelRequest(request_id=request_id),
            timeout=timeout_s,
            metadata=bearer_metadata(token),
        )
        return bool(resp.found)

    async def close(self) -> None:
        links, self._links = list(self._links.values()), OrderedDict()
        for link in links:
            await link.close()
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close()

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_channel(address, self.security)
        return ch

    def _trim(self) -> None:
        """Close the least recently used idle calls beyond ``max_idle_links`` (a call with open streams
        stays)."""
        excess = len(self._links) - self.max_idle_links
        for key in list(self._links):
            if excess <= 0:
                return
            link = self._links[key]
            if not link.streams:
                del self._links[key]
                excess -= 1
                _closing(link)


def _closing(link: MuxLink) -> None:
    task = asyncio.ensure_future(link.close())
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
