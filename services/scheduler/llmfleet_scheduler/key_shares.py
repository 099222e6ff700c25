"""The scheduler's part in splitting API keys' rate limits among its replicas
(``llmfleet.security.limit_shares``): publish this replica's demand under a lease every interval, and
follow the other replicas' records."""

from __future__ import annotations

import asyncio
import json
import logging

from llmfleet.coord import EtcdClient, PrefixView, Registration
from llmfleet.security.limit_shares import INTERVAL_S, Demand, KeyShares, decode, encode

log = logging.getLogger(__name__)


def _decode(raw: bytes) -> dict[str, Demand]:
    return decode(json.loads(raw))


class LiveKeyShares:
    """``shares``' record in etcd at ``limit_demands/<replica>`` (bound to a lease: a replica that dies
    releases its share), and the live replicas' records fed back to ``shares``. Without etcd the
    replica keeps its last fractions."""

    def __init__(self, etcd: EtcdClient, shares: KeyShares) -> None:
        self.shares = shares
        self.record: dict[str, Demand] = {}
        self.registration = Registration(
            etcd, etcd.keys.limit_demand(shares.replica), lambda: json.dumps(encode(self.record)).encode()
        )
        self.view: PrefixView[dict[str, Demand]] = PrefixView(etcd, etcd.keys.limit_demands, _decode)

    async def start(self) -> None:
        await self.registration.start()
        await self.view.start()

    async def stop(self) -> None:
        await self.view.stop()
        await self.registration.stop()

    async def publish(self) -> None:
        """Roll the meter every interval and put the record when it changed (never raises)."""
        while True:
            await asyncio.sleep(INTERVAL_S)
            record = self.shares.roll()
            if encode(record) != encode(self.record):
                self.record = record
                await self.registration.update()

    async def follow(self) -> None:
        """Feed every change of the replicas' records to ``shares``."""
        async for _, records in self.view.subscribe():
            self.shares.peers_changed(records)
