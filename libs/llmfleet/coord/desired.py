"""Desired-state helpers: write/delete ``services/`` and ``placement/`` keys (one at a time, or a whole
plan with its ``placement_meta`` in one transaction), and typed views of them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from aetcd import rpc

from llmfleet.coord.client import EtcdClient
from llmfleet.coord.view import PrefixView
from llmfleet.types import DesiredPlacement, NodeRecord, ServiceSpec


async def put_placement(client: EtcdClient, placement: DesiredPlacement) -> None:
    await client.put(client.keys.placement(placement.engine_id), placement.to_json())


async def delete_placement(client: EtcdClient, engine_id: str) -> bool:
    return await client.delete(client.keys.placement(engine_id))


async def put_service(client: EtcdClient, spec: ServiceSpec) -> None:
    await client.put(client.keys.service(spec.name), spec.to_json())


async def delete_service(client: EtcdClient, name: str) -> bool:
    return await client.delete(client.keys.service(name))


def placement_view(client: EtcdClient) -> PrefixView[DesiredPlacement]:
    """engine_id -> DesiredPlacement (call ``start()``)."""
    return PrefixView(client, client.keys.placements, DesiredPlacement.from_json)


def service_view(client: EtcdClient) -> PrefixView[ServiceSpec]:
    """service name -> ServiceSpec (call ``start()``)."""
    return PrefixView(client, client.keys.services, ServiceSpec.from_json)


def node_view(client: EtcdClient) -> PrefixView[NodeRecord]:
    """node id -> NodeRecord of every live node (call ``start()``)."""
    return PrefixView(client, client.keys.nodes, NodeRecord.from_json)


# -- the placement leader's plan: every placement/ key and placement_meta in one transaction ----------


@dataclass(frozen=True)
class PlanMeta:
    """``placement_meta``: which plan the ``placement/`` keys hold, written with them atomically.

    ``plan_id`` increases by one per plan written; a new leader reads it to adopt the plan in force."""

    plan_id: int
    policy: str
    reason: str = ""
    summary: str = ""
    leader: str = ""
    time: float = 0.0  # unix seconds
    gpus_in_use: int = 0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> PlanMeta:
        d = json.loads(raw)
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def placement_meta_key(client: EtcdClient) -> str:
    """``{prefix}/placement_meta`` (outside the ``placement/`` prefix the engines watch)."""
    return client.keys.prefix.rstrip("/") + "/placement_meta"


async def get_placement_meta(client: EtcdClient) -> PlanMeta | None:
    raw = await client.get(placement_meta_key(client))
    return PlanMeta.from_json(raw) if raw is not None else None


async def fenced_txn(
    client: EtcdClient,
    what: str,
    ops: Sequence[rpc.RequestOp],
    leader: tuple[str, int] | None,
    timeout: float | None = None,
) -> bool:
    """Run ``ops`` in one transaction; with ``leader`` = (leader key, lease id) only while that key is
    still bound to that lease (a deposed leader writes nothing). True if written."""
    compare = []
    if leader is not None:
        key, lease = leader
        compare.append(
            rpc.Compare(key=key.encode(), target=rpc.Compare.LEASE, result=rpc.Compare.EQUAL, lease=lease)
        )
    return await client._txn(what, rpc.TxnRequest(compare=compare, success=list(ops)), timeout)


async def write_plan(
    client: EtcdClient,
    put: Sequence[DesiredPlacement],
    delete: Sequence[str],
    meta: PlanMeta,
    *,
    leader: tuple[str, int] | None = None,
    timeout: float | None = None,
) -> bool:
    """Write ``put``, delete the placement keys of ``delete`` and write ``meta``, all in ONE etcd
    transaction. ``leader`` = (leader key, lease id) fences it: nothing is written unless that key is
    still bound to that lease (a deposed leader cannot overwrite its successor's plan). True if
    written."""
    ops = [
        rpc.RequestOp(
            request_put=rpc.PutRequest(key=client.keys.placement(p.engine_id).encode(), value=p.to_json())
        )
        for p in put
    ]
    ops += [
        rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=client.keys.placement(eid).encode()))
        for eid in delete
    ]
    ops.append(
        rpc.RequestOp(
            request_put=rpc.PutRequest(key=placement_meta_key(client).encode(), value=meta.to_json())
        )
    )
    return await fenced_txn(client, f"write plan {meta.plan_id}", ops, leader, timeout)
