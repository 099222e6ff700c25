"""``llmfleet status``: what etcd says about the cluster (nodes, services, placement, leaders, the
engine pool and GPUs in use), plus what the placement leader says (GetPlan: its recent decisions and
the service monitor).

Data collection (:func:`collect_status`, over any :class:`StatusSource` and :data:`PlanSource`) is
separate from rendering (:func:`render_status` for rich tables, :meth:`ClusterStatus.to_dict` for
``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, Protocol

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llmfleet.cli.status_fleet import (
    FleetStatus,
    PlanSource,
    attach_plan,
    fleet_status,
    grpc_plan_source,
    render_fleet,
)
from llmfleet.cli.status_migration import (
    MigrationSource,
    MigrationStatus,
    grpc_migration_source,
    migration_status,
    render_migration,
)
from llmfleet.config import EtcdSettings
from llmfleet.coord.client import EtcdClient
from llmfleet.coord.keys import Keys
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, NodeRecord


class KV(NamedTuple):
    key: str
    value: bytes
    lease: int = 0


class StatusSource(Protocol):
    """Where status comes from (etcd in production, a dict in tests)."""

    async def range(self, prefix: str, leases: bool = False) -> list[KV]:
        """Every key under ``prefix``; ``leases=True`` asks for each key's lease id."""
        ...

    async def lease_ttl(self, lease_id: int) -> int:
        """Remaining TTL in seconds, -1 when the lease no longer exists."""
        ...


class EtcdStatusSource:
    """:class:`StatusSource` over :class:`llmfleet.coord.client.EtcdClient`."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def range(self, prefix: str, leases: bool = False) -> list[KV]:
        values, _ = await self.client.get_prefix(prefix)
        if not leases:
            return [KV(k, v) for k, v in sorted(values.items())]
        keys = sorted(values)
        kvs = await asyncio.gather(*(self.client.get_kv(key) for key in keys))
        # a key deleted between the two reads is dropped
        return [KV(key, kv.value, kv.lease) for key, (kv, _) in zip(keys, kvs, strict=True) if kv is not None]

    async def lease_ttl(self, lease_id: int) -> int:
        return await self.client.lease_ttl(lease_id)


@dataclass
class NodeRow:
    node_id: str
    role: str = ""
    address: str = ""
    device: str = ""
    models: list[str] = field(default_factory=list)
    pid: int = 0
    lease_id: int = 0
    lease_ttl_s: int | None = None  # None: no lease; -1: expired
    error: str | None = None


@dataclass
class ServiceRow:
    name: str
    model: str = ""
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    priority: int = 0
    max_tokens: int | None = None
    error: str | None = None


@dataclass
class PlacementRow:
    engine_id: str
    desired: list[str] | None  # None: no placement key for this engine
    loaded: list[str] | None  # None: engine not registered under nodes/
    in_sync: bool = False
    error: str | None = None


@dataclass
class LeaderRow:
    role: str
    leader: str


@dataclass
class ClusterStatus:
    prefix: str
    etcd: str = ""
    nodes: list[NodeRow] = field(default_factory=list)
    services: list[ServiceRow] = field(default_factory=list)
    placements: list[PlacementRow] = field(default_factory=list)
    leaders: list[LeaderRow] = field(default_factory=list)
    fleet: FleetStatus = field(default_factory=FleetStatus)  # engine pool, decisions, service monitor
    migration: MigrationStatus | None = None  # the migration leader's Status (None: not asked)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _relative(key: str, prefix: str) -> str:
    return key[len(prefix) :] if key.startswith(prefix) else Keys.leaf(key)


def _leader_id(raw: bytes) -> str:
    text = raw.decode(errors="replace").strip()
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict):
        for k in ("node_id", "candidate_id", "id", "leader"):
            if k in value:
                return str(value[k])
    return text if not isinstance(value, str) else value


def _node_rows(
    node_kvs: list[KV], prefix: str, ttls: dict[int, int]
) -> tuple[list[NodeRow], dict[str, NodeRecord]]:
    """One row per key under ``nodes/`` (``error`` set when its record does not decode), and the
    records that did decode, by node id."""
    rows: list[NodeRow] = []
    records: dict[str, NodeRecord] = {}
    for kv in node_kvs:
        node_id = _relative(kv.key, prefix)
        row = NodeRow(
            node_id=node_id, lease_id=kv.lease, lease_ttl_s=ttls.get(kv.lease) if kv.lease else None
        )
        try:
            rec = NodeRecord.from_json(kv.value)
        except (ValueError, TypeError, KeyError) as e:
            row.error = f"bad node record: {e}"
        else:
            records[node_id] = rec
            row.role, row.address, row.device = rec.role, rec.address, rec.device
            row.models, row.pid = list(rec.models), rec.pid
        rows.append(row)
    return rows, records


def _service_rows(svc_kvs: list[KV], prefix: str) -> list[ServiceRow]:
    rows: list[ServiceRow] = []
    for kv in svc_kvs:
        name = _relative(kv.key, prefix)
        try:
            spec = ServiceSpec.from_json(kv.value)
        except (ValueError, TypeError, KeyError) as e:
            rows.append(ServiceRow(name=name, error=f"bad service spec: {e}"))
            continue
        rows.append(
            ServiceRow(
                name=spec.name or name,
                model=spec.model,
                ttft_slo_s=spec.slo.ttft_s,
                tpot_slo_s=spec.slo.tpot_s,
                priority=spec.priority,
                max_tokens=spec.max_tokens,
            )
        )
    return rows


def _placement_rows(
    place_kvs: list[KV], prefix: str, records: dict[str, NodeRecord]
) -> tuple[list[PlacementRow], dict[str, DesiredPlacement]]:
    """One row per engine with a placement or a node record (desired vs loaded models), and the
    placements that decoded, by engine id."""
    desired: dict[str, list[str] | None] = {}
    placements: dict[str, DesiredPlacement] = {}
    errors: dict[str, str] = {}
    for kv in place_kvs:
        engine_id = _relative(kv.key, prefix)
        try:
            placements[engine_id] = DesiredPlacement.from_json(kv.value)
            desired[engine_id] = [m.name for m in placements[engine_id].models]
        except (ValueError, TypeError, KeyError) as e:
            desired[engine_id], errors[engine_id] = None, f"bad placement: {e}"
    engines = {nid for nid, r in records.items() if r.role == ENGINE_ROLE}
    rows: list[PlacementRow] = []
    for engine_id in sorted(set(desired) | engines):
        want = desired.get(engine_id)
        rec = records.get(engine_id)
        have = list(rec.models) if rec is not None else None
        rows.append(
            PlacementRow(
                engine_id=engine_id,
                desired=want,
                loaded=have,
                in_sync=want is not None and have is not None and sorted(want) == sorted(have),
                error=errors.get(engine_id),
            )
        )
    return rows, placements


async def collect_status(
    source: StatusSource,
    keys: Keys,
    etcd: str = "",
    plan: PlanSource | None = None,
    migration: MigrationSource | None = None,
) -> ClusterStatus:
    """Read ``nodes/``, ``services/``, ``placement/`` and ``leaders/`` into a :class:`ClusterStatus`,
    then (with ``plan``) ask the placement leader for its decisions and service monitor.

    Undecodable values become rows with ``error`` set rather than failing the whole report; a leader
    that cannot be asked leaves ``plan_error`` set.
    """
    node_kvs, svc_kvs, place_kvs, leader_kvs = await asyncio.gather(
        source.range(keys.nodes, leases=True),
        source.range(keys.services),
        source.range(keys.placements),
        source.range(keys.leaders),
    )
    leases = sorted({kv.lease for kv in node_kvs if kv.lease})
    ttls = dict(
        zip(leases, await asyncio.gather(*(source.lease_ttl(lease) for lease in leases)), strict=True)
    )
    status = ClusterStatus(prefix=keys.prefix, etcd=etcd)
    status.nodes, records = _node_rows(node_kvs, keys.nodes, ttls)
    status.services = _service_rows(svc_kvs, keys.services)
    status.placements, placements = _placement_rows(place_kvs, keys.placements, records)
    for kv in leader_kvs:
        role = _relative(kv.key, keys.leaders).split("/", 1)[0]
        status.leaders.append(LeaderRow(role=role, leader=_leader_id(kv.value)))

    status.fleet = fleet_status(records.values(), placements)
    if plan is not None:
        leader = next((r.leader for r in status.leaders if r.role == "placement"), None)
        await attach_plan(status.fleet, leader, records, plan)
    if migration is not None:
        leader = next((r.leader for r in status.leaders if r.role == "migration"), None)
        status.migration = await migration_status(leader, records, migration)
    return status


def _ttl(row: NodeRow) -> str:
    if row.lease_ttl_s is None:
        return "-"
    return "[red]expired[/]" if row.lease_ttl_s < 0 else f"{row.lease_ttl_s}s"


def _models(models: list[str] | None) -> str:
    return "[dim]-[/]" if models is None else (", ".join(models) or "[dim](none)[/]")


def render_status(status: ClusterStatus, console: Console) -> None:
    """Print ``status`` as rich tables."""
    console.print(f"[bold]etcd[/] {status.etcd or '?'}  [bold]prefix[/] {status.prefix}")

    nodes = Table(title=f"nodes ({len(status.nodes)})", title_justify="left")
    for col in ("id", "role", "address", "device", "models", "pid", "lease", "ttl"):
        nodes.add_column(col)
    for n in status.nodes:
        if n.error:
            nodes.add_row(n.node_id, f"[red]{escape(n.error)}[/]", "", "", "", "", f"{n.lease_id:x}", _ttl(n))
            continue
        lease = f"{n.lease_id:x}" if n.lease_id else "-"
        models = _models(n.models) if n.role == ENGINE_ROLE or n.models else ""
        nodes.add_row(n.node_id, n.role, n.address, n.device, models, str(n.pid or ""), lease, _ttl(n))
    console.print(nodes)

    services = Table(title=f"services ({len(status.services)})", title_justify="left")
    for col in ("name", "model", "ttft slo", "tpot slo", "priority", "max tokens"):
        services.add_column(col)
    for s in status.services:
        if s.error:
            services.add_row(s.name, f"[red]{escape(s.error)}[/]", "", "", "", "")
            continue
        services.add_row(
            s.name,
            s.model,
            f"{s.ttft_slo_s:g}s",
            f"{s.tpot_slo_s:g}s",
            str(s.priority),
            str(s.max_tokens),
        )
    console.print(services)

    placement = Table(title=f"placement ({len(status.placements)})", title_justify="left")
    for col in ("engine", "desired", "loaded", "state"):
        placement.add_column(col)
    for p in status.placements:
        if p.error:
            state = f"[red]{escape(p.error)}[/]"
        elif p.loaded is None:
            state = "[red]engine not registered[/]"
        elif p.desired is None:
            state = "[yellow]no placement[/]"
        else:
            state = "[green]in sync[/]" if p.in_sync else "[yellow]reconciling[/]"
        placement.add_row(p.engine_id, _models(p.desired), _models(p.loaded), state)
    console.print(placement)

    leaders = Table(title=f"leaders ({len(status.leaders)})", title_justify="left")
    leaders.add_column("role")
    leaders.add_column("leader")
    for r in status.leaders:
        leaders.add_row(r.role, r.leader)
    console.print(leaders)
    render_fleet(status.fleet, console)
    if status.migration is not None:
        render_migration(status.migration, console)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--etcd", default=None, help="etcd endpoints host:port[,host:port] (env LLMFLEET_ETCD)")
    p.add_argument("--prefix", default=None, help="etcd key prefix (env LLMFLEET_PREFIX, default /llmfleet)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for etcd")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


async def fetch_status(endpoints: str | None, prefix: str | None, timeout: float = 5.0) -> ClusterStatus:
    """Connect to etcd and collect the status (raises EtcdError/EtcdUnavailable on failure); the
    placement leader is asked too (its absence is noted in ``plan_error``)."""

    settings = EtcdSettings.from_env(endpoints=endpoints, prefix=prefix)
    settings.timeout_s = timeout
    client = EtcdClient(settings)
    try:
        await asyncio.wait_for(client.connect(wait=False), timeout)
        return await collect_status(
            EtcdStatusSource(client),
            client.keys,
            etcd=",".join(settings.endpoints),
            plan=grpc_plan_source(min(timeout, 3.0)),
            migration=grpc_migration_source(min(timeout, 3.0)),
        )
    finally:
        await client.close()


def run(args: argparse.Namespace) -> int:
    console = Console()
    try:
        status = asyncio.run(fetch_status(args.etcd, args.prefix, args.timeout))
    except Exception as e:  # etcd unreachable, bad endpoint: say so and exit non-zero
        Console(stderr=True).print(f"[red]error:[/] cannot read cluster status from etcd: {escape(str(e))}")
        return 3
    if args.json:
        print(json.dumps(status.to_dict(), indent=2, sort_keys=True))
    else:
        render_status(status, console)
    return 0
