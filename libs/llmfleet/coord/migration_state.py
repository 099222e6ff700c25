"""``migration_state``: what the migration leader decided, for the schedulers and a successor.

Ownership (docs/migration.md): the placement leader decides which models each engine
hosts (``placement/{engine}``); among the engines hosting a model, the migration leader decides which
are **active** — receive new requests — and where running requests live. It writes one key,
``{prefix}/migration_state``, fenced by its leader lease: the epoch counter (a successor continues it,
so migration ids never repeat), the active set, and the policy's dispatch view (Mell's GPU types and
activation order, read by the schedulers' ``mell`` dispatch so arrivals go where Allocate would put
them). Engines outside the active set keep their models (placement is unchanged) but get no new work;
a scheduler without the key (no migration leader yet) treats every engine as active.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from aetcd import rpc

from llmfleet.coord.client import EtcdClient
from llmfleet.coord.desired import fenced_txn
from llmfleet.coord.view import PrefixView


@dataclass(frozen=True)
class MigrationState:
    epoch: int
    policy: str
    leader: str = ""
    time: float = 0.0  # unix seconds
    active: tuple[str, ...] | None = None  # None: the policy does not gate engines (all active)
    view: dict[str, Any] = field(default_factory=dict)  # the policy's dispatch view (JSON object)

    def to_json(self) -> bytes:
        d = asdict(self)
        d["active"] = list(self.active) if self.active is not None else None
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> MigrationState:
        d = json.loads(raw)
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if d.get("active") is not None:
            d["active"] = tuple(d["active"])
        return cls(**d)


def migration_state_key(client: EtcdClient) -> str:
    """``{prefix}/migration_state`` (outside every prefix the engines watch)."""
    return client.keys.prefix.rstrip("/") + "/migration_state"


async def get_migration_state(client: EtcdClient) -> MigrationState | None:
    raw = await client.get(migration_state_key(client))
    return MigrationState.from_json(raw) if raw is not None else None


async def write_migration_state(
    client: EtcdClient,
    state: MigrationState,
    *,
    leader: tuple[str, int] | None = None,
    timeout: float | None = None,
) -> bool:
    """Write the state; ``leader`` = (leader key, lease id) fences it (a deposed leader writes
    nothing). True if written."""
    op = rpc.RequestOp(
        request_put=rpc.PutRequest(key=migration_state_key(client).encode(), value=state.to_json())
    )
    return await fenced_txn(client, f"write migration state {state.epoch}", [op], leader, timeout)


def migration_state_view(client: EtcdClient) -> PrefixView[MigrationState]:
    """The one ``migration_state`` key as a view (leaf ``""``; call ``start()``)."""
    return PrefixView(client, migration_state_key(client), MigrationState.from_json)
