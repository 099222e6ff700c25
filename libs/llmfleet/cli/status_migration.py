"""The migration part of ``llmfleet status``: the migration leader's Status (per-engine active flag,
Mell GPU type, KV use and prefix cache; migrations running and recent; migrations per epoch).

An engine's prefix cache is its share of the KV pool that cached blocks hold (held by requests or
idle, as the load monitor reads it for cache-aware dispatch: ``-`` when the engine reports no size)
and its hit rate since it started (prompt tokens found cached over those looked up)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llmfleet.api.v1 import migration_pb2, migration_pb2_grpc
from llmfleet.load.monitor import report_from_proto
from llmfleet.rpc.channels import open_channel
from llmfleet.types import NodeRecord

EPOCHS_SHOWN = 8
MIGRATIONS_SHOWN = 10


@dataclass
class MigrationEngineRow:
    engine_id: str
    active: bool
    gpu_type: str
    running: int
    waiting: int
    kv_used_bytes: int
    kv_capacity_bytes: int
    prefix_cached_bytes: int | None = None  # KV its prefix cache holds (None: not reported)
    prefix_hit_rate: float | None = None  # prompt tokens found cached / looked up (None: none looked up)


@dataclass
class MigrationRow:
    migration_id: str
    request_id: str
    source: str
    destination: str
    mode: str
    kv_bytes: int
    state: str
    error: str = ""
    seconds: float = 0.0


@dataclass
class EpochRow:
    epoch: int
    time: float
    operations: int
    planned: int
    executed: int
    failed: int
    deferred: int
    cancelled: int
    activated: list[str]
    deactivated: list[str]
    active_engines: int


@dataclass
class MigrationStatus:
    leader: str = ""
    policy: str = ""
    epoch_s: float = 0.0
    engines: list[MigrationEngineRow] = field(default_factory=list)
    running: list[MigrationRow] = field(default_factory=list)
    recent: list[MigrationRow] = field(default_factory=list)
    epochs: list[EpochRow] = field(default_factory=list)
    error: str | None = None


# Status of the migration replica at an address (raises when it cannot be asked)
MigrationSource = Callable[[str], Awaitable[migration_pb2.StatusResponse]]


def _row(r: migration_pb2.MigrationRecord) -> MigrationRow:
    return MigrationRow(
        r.migration_id, r.request_id, r.source, r.destination, r.mode, r.kv_bytes, r.state, r.error, r.seconds
    )


def _engine_row(e: migration_pb2.EngineKvStatus) -> MigrationEngineRow:
    load = e.load
    cache = load.prefix_cache if load.HasField("prefix_cache") else None
    return MigrationEngineRow(
        e.engine_id,
        e.active,
        e.gpu_type,
        load.running,
        load.waiting,
        load.kv_used_bytes,
        load.kv_capacity_bytes,
        report_from_proto(load).prefix_cached_bytes,
        cache.hits / cache.queries if cache is not None and cache.queries else None,
    )


def _epoch_row(s: migration_pb2.EpochRecord) -> EpochRow:
    return EpochRow(
        s.epoch, s.time, s.operations, s.planned, s.executed, s.failed, s.deferred, s.cancelled,
        list(s.activated), list(s.deactivated), s.active_engines,
    )  # fmt: skip


async def migration_status(
    leader: str | None, records: Mapping[str, NodeRecord], source: MigrationSource
) -> MigrationStatus:
    """Ask the migration leader (best effort: ``error`` says why when it cannot be asked)."""
    rec = records.get(leader) if leader else None
    if rec is None:
        msg = "no migration leader" if not leader else f"migration leader {leader} not registered"
        return MigrationStatus(leader=leader or "", error=msg)
    try:
        reply = await source(rec.address)
    except Exception as e:  # down, unreachable, timed out: the rest of the status stands
        details = e.details() if hasattr(e, "details") else str(e)
        return MigrationStatus(
            leader=leader or "", error=f"migration leader {leader} at {rec.address}: {details}"
        )
    out = MigrationStatus(leader=leader or "", policy=reply.policy, epoch_s=reply.epoch_s)
    out.engines = [_engine_row(e) for e in reply.engines]
    out.running = [_row(r) for r in reply.running]
    out.recent = [_row(r) for r in reply.recent]
    out.epochs = [_epoch_row(s) for s in reply.epochs]
    return out


def render_migration(m: MigrationStatus, console: Console) -> None:
    if m.error:
        console.print(f"[bold]migration[/] [yellow]{escape(m.error)}[/]")
        return
    engines = Table(
        title=f"migration ({m.policy or '?'}, epoch {m.epoch_s:g} s, leader {m.leader})", title_justify="left"
    )
    for col in ("engine", "active", "type", "running", "waiting", "kv use", "prefix cache", "hit rate"):
        engines.add_column(col)
    for e in m.engines:
        cap = e.kv_capacity_bytes
        use = f"{e.kv_used_bytes / cap:.1%}" if cap else "-"
        cached = f"{e.prefix_cached_bytes / cap:.1%}" if cap and e.prefix_cached_bytes is not None else "-"
        hits = f"{e.prefix_hit_rate:.1%}" if e.prefix_hit_rate is not None else "-"
        engines.add_row(
            e.engine_id,
            "yes" if e.active else "[dim]no[/]",
            e.gpu_type or "-",
            str(e.running),
            str(e.waiting),
            use,
            cached,
            hits,
        )
    console.print(engines)
    if m.epochs:
        epochs = Table(
            title=f"migration epochs (last {min(len(m.epochs), EPOCHS_SHOWN)})", title_justify="left"
        )
        for col in (
            "epoch",
            "time",
            "ops",
            "planned",
            "done",
            "failed",
            "deferred",
            "cancelled",
            "active",
            "+/-",
        ):
            epochs.add_column(col)
        for s in m.epochs[-EPOCHS_SHOWN:]:
            change = " ".join([f"+{a}" for a in s.activated] + [f"-{d}" for d in s.deactivated])
            epochs.add_row(
                str(s.epoch), time.strftime("%H:%M:%S", time.localtime(s.time)), str(s.operations),
                str(s.planned), str(s.executed), str(s.failed), str(s.deferred), str(s.cancelled),
                str(s.active_engines), change,
            )  # fmt: skip
        console.print(epochs)
    moves = m.running + m.recent[-MIGRATIONS_SHOWN:]
    if moves:
        table = Table(title="migrations (running, then recent)", title_justify="left")
        for col in ("request", "from", "to", "mode", "KiB", "state", "s"):
            table.add_column(col)
        for r in moves:
            state = r.state if r.state != "failed" else f"[red]failed[/] {escape(r.error)}"
            table.add_row(
                r.request_id,
                r.source,
                r.destination,
                r.mode,
                f"{r.kv_bytes / 1024:.0f}",
                state,
                f"{r.seconds:.3f}",
            )
        console.print(table)


def grpc_migration_source(timeout: float) -> MigrationSource:
    """Migration.Status over gRPC with ``timeout``."""

    async def get_status(address: str) -> migration_pb2.StatusResponse:
        async with open_channel(address) as channel:
            return await migration_pb2_grpc.MigrationStub(channel).Status(
                migration_pb2.StatusRequest(), timeout=timeout
            )

    return get_status
