"""``placement_unplaced``: the models the placement leader will not place, and why, for the schedulers.

A request for a model no engine hosts waits while placement loads it (scale from zero). When
the leader knows it never will — the static policy lists the model on no engine, or a planner left the
service out (its model is undeclared, or has no cost-model catalog name) — waiting is pointless: the
leader writes ``{prefix}/placement_unplaced`` (model -> reason, fenced by its leader lease) whenever
that set changes, and the schedulers fail such requests at once (FAILED_PRECONDITION with the reason).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from aetcd import rpc

from llmfleet.coord.client import EtcdClient
from llmfleet.coord.desired import fenced_txn
from llmfleet.coord.election import LeaderElection
from llmfleet.coord.view import PrefixView


def unplaced_key(client: EtcdClient) -> str:
    """``{prefix}/placement_unplaced`` (outside every prefix the engines watch)."""
    return client.keys.prefix.rstrip("/") + "/placement_unplaced"


def decode(raw: bytes | str) -> dict[str, str]:
    d = json.loads(raw)
    if not isinstance(d, dict):
        raise ValueError("placement_unplaced must be a JSON object")
    return {str(k): str(v) for k, v in d.items()}


async def write_unplaced(
    client: EtcdClient, models: Mapping[str, str], *, leader: tuple[str, int] | None = None
) -> bool:
    """Replace the unplaced models (model -> reason); ``leader`` fences it. True if written."""
    value = json.dumps(dict(sorted(models.items()))).encode()
    op = rpc.RequestOp(request_put=rpc.PutRequest(key=unplaced_key(client).encode(), value=value))
    return await fenced_txn(client, "write unplaced models", [op], leader, None)


def unplaced_view(client: EtcdClient) -> PrefixView[dict[str, str]]:
    """The one key as a view (leaf ``""``; call ``start()``)."""
    return PrefixView(client, unplaced_key(client), decode)


@dataclass
class UnplacedPublisher:
    """Writes the unplaced models when they change, as the leader (``election``: fences the write; a
    replica that is not the leader writes nothing)."""

    etcd: EtcdClient
    election: LeaderElection | None = None
    published: dict[str, str] | None = None

    async def publish(self, models: Mapping[str, str]) -> None:
        if self.published is not None and dict(models) == self.published:
            return
        guard = None
        if self.election is not None:
            if not self.election.is_leader or self.election.lease_id is None:
                return
            guard = (self.election.key, self.election.lease_id)
        if await write_unplaced(self.etcd, models, leader=guard):
            self.published = dict(models)
