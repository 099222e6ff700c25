"""Desired-state helpers: write/delete ``services/`` and ``placement/`` keys (one at a time, or a whole
plan with its ``placement_meta`` in one transaction), typed views of them, ``models/`` (runtime model
declarations), seeding ``services/`` + ``models/`` from the cluster file once (``services_seeded``),
and ``llmfleet apply``'s all-or-nothing batch writes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from aetcd import rpc
from aetcd.utils import prefix_range_end

from llmfleet.coord.client import EtcdClient
from llmfleet.coord.view import PrefixView
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import DesiredPlacement, NodeRecord


async def put_placement(client: EtcdClient, placement: DesiredPlacement) -> None:
    await client.put(client.keys.placement(placement.engine_id), placement.to_json())


async def delete_placement(client: EtcdClient, engine_id: str) -> bool:
    return await client.delete(client.keys.placement(engine_id))


async def put_service(client: EtcdClient, spec: ServiceSpec) -> None:
    await client.put(client.keys.service(spec.name), spec.to_json())


async def delete_service(client: EtcdClient, name: str) -> bool:
    return await client.delete(client.keys.service(name))


@dataclass(frozen=True)
class ModelEntry:
    """A model services can refer to (etcd key ``models/{name}``): the cluster file's ``models:``
    entry. ``sim_model`` is the cost-model catalog name the placement planners use for it; a LoRA
    adapter has ``base`` and ``adapter`` (its directory) and an empty ``source``."""

    name: str
    source: str
    dtype: str = "float32"
    sim_model: str | None = None
    base: str | None = None
    adapter: str | None = None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> ModelEntry:
        d = json.loads(raw)  # keys a newer writer added are ignored
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def model_view(client: EtcdClient) -> PrefixView[ModelEntry]:
    """model name -> ModelEntry (call ``start()``)."""
    return PrefixView(client, client.keys.models, ModelEntry.from_json)


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
    compare: Sequence[rpc.Compare] = (),
) -> bool:
    """Run ``ops`` in one transaction; with ``leader`` = (leader key, lease id) only while that key is
    still bound to that lease (a deposed leader writes nothing), and only if every ``compare``
    holds. True if written."""
    compare = list(compare)
    if leader is not None:
        key, lease = leader
        compare.append(
            rpc.Compare(key=key.encode(), target=rpc.Compare.LEASE, result=rpc.Compare.EQUAL, lease=lease)
        )
    return await client.txn(what, rpc.TxnRequest(compare=compare, success=list(ops)), timeout)


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


# -- services/ and models/: seeded once from the cluster file, then changed by `llmfleet apply` ---------


@dataclass(frozen=True)
class SeedRecord:
    """The value of ``services_seeded``: who seeded ``services/`` and ``models/``, from what, when."""

    leader: str = ""
    config: str = ""  # the cluster file's path, as the leader was given it
    time: float = 0.0  # unix seconds
    services: tuple[str, ...] = ()  # what this seeding wrote
    models: tuple[str, ...] = ()
    reseed: bool = False

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> SeedRecord:
        d = json.loads(raw)
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in ("services", "models"):
            d[k] = tuple(d.get(k, ()))
        return cls(**d)


async def get_seed(client: EtcdClient) -> SeedRecord | None:
    raw = await client.get(client.keys.services_seeded)
    return SeedRecord.from_json(raw) if raw is not None else None


def _put(key: str, value: bytes) -> rpc.RequestOp:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key.encode(), value=value))


def _absent(key: str) -> rpc.Compare:
    return rpc.Compare(
        key=key.encode(), target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0
    )


def _unchanged_since(key: str, revision: int) -> rpc.Compare:
    """``key`` was not written (created, changed or deleted) after ``revision``."""
    return rpc.Compare(
        key=key.encode(), target=rpc.Compare.MOD, result=rpc.Compare.LESS, mod_revision=revision + 1
    )


async def seed_desired(
    client: EtcdClient,
    services: Sequence[ServiceSpec],
    models: Sequence[ModelEntry],
    record: SeedRecord,
    *,
    reseed: bool = False,
    leader: tuple[str, int] | None = None,
    timeout: float | None = None,
) -> bool:
    """Seed ``services/`` and ``models/`` from the cluster file in ONE transaction with the
    ``services_seeded`` marker. True if written.

    Without ``reseed`` it only writes when there is no marker yet and only the given entries (pass
    those etcd lacks; each must still be absent, so a concurrent ``llmfleet apply`` is never
    overwritten: the transaction fails and the caller reads again). With ``reseed`` ``services/`` and
    ``models/`` are replaced by exactly the given entries. ``leader`` fences it like :func:`write_plan`."""
    keys = client.keys
    ops: list[rpc.RequestOp] = []
    compare: list[rpc.Compare] = []
    if reseed:  # delete what the config lacks (etcd refuses a txn deleting a key it also puts)
        keep = {keys.model(m.name) for m in models} | {keys.service(s.name) for s in services}
        for prefix in (keys.services, keys.models):
            have, rev = await client.get_prefix(prefix, timeout=timeout)
            ops += [
                rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=k.encode()))
                for k in sorted(set(have) - keep)
            ]
            p = prefix.encode()  # nothing under the prefix changed since this read
            compare.append(
                rpc.Compare(
                    key=p,
                    range_end=prefix_range_end(p),
                    target=rpc.Compare.MOD,
                    result=rpc.Compare.LESS,
                    mod_revision=rev + 1,
                )
            )
    else:
        compare.append(_absent(keys.services_seeded))
        compare += [_absent(keys.model(m.name)) for m in models]
        compare += [_absent(keys.service(s.name)) for s in services]
    ops += [_put(keys.model(m.name), m.to_json()) for m in models]
    ops += [_put(keys.service(s.name), s.to_json()) for s in services]
    ops.append(_put(keys.services_seeded, record.to_json()))
    what = "reseed services" if reseed else "seed services"
    return await fenced_txn(client, what, ops, leader, timeout, compare)


async def write_desired(
    client: EtcdClient,
    services: Sequence[ServiceSpec] = (),
    models: Sequence[ModelEntry] = (),
    delete_services: Sequence[str] = (),
    *,
    unchanged_since: int | None = None,
    timeout: float | None = None,
) -> bool:
    """Put ``models`` and ``services`` and delete ``delete_services`` in ONE transaction (all or
    nothing). With ``unchanged_since`` (the revision the caller read them at) only if none of those
    keys was written since: a concurrent writer makes it fail (False) instead of being overwritten."""
    keys = client.keys
    touched = [keys.model(m.name) for m in models] + [keys.service(s.name) for s in services]
    touched += [keys.service(n) for n in delete_services]
    ops = [_put(keys.model(m.name), m.to_json()) for m in models]
    ops += [_put(keys.service(s.name), s.to_json()) for s in services]
    ops += [
        rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=keys.service(n).encode()))
        for n in delete_services
    ]
    compare = [] if unchanged_since is None else [_unchanged_since(k, unchanged_since) for k in touched]
    return await fenced_txn(client, f"write {len(touched)} service/model keys", ops, None, timeout, compare)
