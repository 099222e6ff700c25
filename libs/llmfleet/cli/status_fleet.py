"""``llmfleet status``, the fleet part: the engine pool and GPUs in use (from etcd's node records and
placements), and the placement leader's recent decisions and service monitor (from its GetPlan)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llmfleet.api.v1 import placement_pb2, placement_pb2_grpc
from llmfleet.monitor import engine_pool
from llmfleet.monitor.wire import BadReport, stats_from_proto
from llmfleet.rpc.channels import open_channel
from llmfleet.types import DesiredPlacement, NodeRecord

DECISIONS_SHOWN = 10  # in the table (--json has every decision GetPlan returns)


@dataclass
class PoolRow:
    """An engine of the pool: idle when it hosts no model and is given none."""

    engine_id: str
    hardware: str = ""
    tp: int = 1
    device: str = ""
    memory_bytes: int = 0
    models: list[str] = field(default_factory=list)
    desired: list[str] = field(default_factory=list)
    idle: bool = True


@dataclass
class DecisionRow:
    time: float
    policy: str
    summary: str
    reason: str = ""
    ok: bool = True
    error: str = ""


@dataclass
class MonitorRow:
    """A service as the placement leader's monitor sees it, over its ``window_s`` window."""

    service: str
    model: str = ""
    window_s: float = 0.0
    rate_rps: float = 0.0
    completed: int = 0
    failed: int = 0
    attainment: float | None = None
    normalized_latency: float | None = None
    ttft_p99_s: float = 0.0
    latency_p99_s: float = 0.0
    mean_prompt_tokens: float = 0.0
    mean_output_tokens: float = 0.0


@dataclass
class FleetStatus:
    pool: list[PoolRow] = field(default_factory=list)
    gpus_in_use: int = 0
    gpus_total: int = 0
    decisions: list[DecisionRow] = field(default_factory=list)
    monitor: list[MonitorRow] = field(default_factory=list)
    plan_error: str | None = None  # why the placement leader's GetPlan is missing (None: it answered)


def fleet_status(records: Iterable[NodeRecord], placements: Mapping[str, DesiredPlacement]) -> FleetStatus:
    """The engine pool part (GPUs in use: Σ tp of engines hosting or given a model)."""
    pool = engine_pool(records, placements)
    return FleetStatus(
        pool=[
            PoolRow(
                e.engine_id,
                e.hardware,
                e.tp,
                e.device,
                e.memory_bytes,
                list(e.models),
                list(e.desired),
                e.idle,
            )
            for e in pool.engines
        ],
        gpus_in_use=pool.gpus_in_use,
        gpus_total=pool.gpus_total,
    )


# GetPlan of the placement replica at an address (raises when it cannot be asked)
PlanSource = Callable[[str], Awaitable[placement_pb2.PlacementPlan]]


async def attach_plan(
    fleet: FleetStatus, leader: str | None, records: Mapping[str, NodeRecord], plan: PlanSource
) -> None:
    """Decisions and the service monitor from the placement leader's GetPlan (best effort: a leader
    that cannot be asked leaves ``plan_error`` set)."""
    rec = records.get(leader) if leader else None
    if rec is None:
        fleet.plan_error = (
            "no placement leader" if not leader else f"placement leader {leader} not registered"
        )
        return
    try:
        reply = await plan(rec.address)
    except Exception as e:  # down, unreachable, timed out: the etcd part of the status stands
        details = e.details() if hasattr(e, "details") else str(e)
        fleet.plan_error = f"placement leader {leader} at {rec.address}: {details or type(e).__name__}"
        return
    fleet.decisions = [
        DecisionRow(d.time, d.policy, d.summary, d.reason, d.ok, d.error) for d in reply.decisions
    ]
    for msg in reply.services:
        try:
            stats = stats_from_proto(msg, 0.0)
        except BadReport as e:
            fleet.monitor.append(MonitorRow(service=msg.service or "?", model=f"bad stats: {e}"))
            continue
        w = stats.window()
        fleet.monitor.append(
            MonitorRow(
                service=stats.service,
                model=stats.model,
                window_s=w.window_s,
                rate_rps=w.rate_rps,
                completed=w.completed,
                failed=w.failed,
                attainment=w.attainment,
                normalized_latency=w.normalized_latency,
                ttft_p99_s=w.ttft_s.p99,
                latency_p99_s=w.latency_s.p99,
                mean_prompt_tokens=w.prompt_tokens.mean,
                mean_output_tokens=w.output_tokens.mean,
            )
        )


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n else "-"


def _fraction(x: float | None, fmt: str = "{:.0%}") -> str:
    return "[dim]-[/]" if x is None else fmt.format(x)


def render_fleet(fleet: FleetStatus, console: Console) -> None:
    """The engine pool, the service monitor and the placement decisions."""
    title = f"engine pool ({len(fleet.pool)}) — GPUs in use: {fleet.gpus_in_use} of {fleet.gpus_total}"
    pool = Table(title=title, title_justify="left")
    for col in ("engine", "hardware", "tp", "device", "memory", "models"):
        pool.add_column(col)
    for e in fleet.pool:
        if e.idle:
            models = "[dim]idle[/]"
        else:
            coming = [m for m in e.desired if m not in e.models]
            going = [m for m in e.models if e.desired and m not in e.desired]
            models = ", ".join(
                [m for m in e.models if m not in going]
                + [f"[green]+{m}[/]" for m in coming]
                + [f"[yellow]-{m}[/]" for m in going]
            )
        pool.add_row(e.engine_id, e.hardware or "?", str(e.tp), e.device, _gib(e.memory_bytes), models)
    console.print(pool)
    if fleet.plan_error:
        console.print(f"[yellow]placement leader not asked:[/] {escape(fleet.plan_error)}")
        return
    if fleet.monitor:
        window = fleet.monitor[0].window_s
        mon = Table(title=f"service monitor (last {window:g} s)", title_justify="left")
        for col in ("service", "model", "rate", "done", "failed", "slo", "norm. latency", "p99 ttft",
                    "p99 latency", "prompt", "output"):  # fmt: skip
            mon.add_column(col)
        for m in fleet.monitor:
            mon.add_row(
                m.service, escape(m.model), f"{m.rate_rps:.2f}/s", str(m.completed), str(m.failed),
                _fraction(m.attainment), _fraction(m.normalized_latency, "{:.2f}"), f"{m.ttft_p99_s:.3f}s",
                f"{m.latency_p99_s:.3f}s", f"{m.mean_prompt_tokens:.0f}", f"{m.mean_output_tokens:.0f}",
            )  # fmt: skip
        console.print(mon)
    shown = fleet.decisions[-DECISIONS_SHOWN:]
    decisions = Table(
        title=f"placement decisions (last {len(shown)} of {len(fleet.decisions)})", title_justify="left"
    )
    for col in ("time", "policy", "decision", "reason"):
        decisions.add_column(col)
    for d in shown:
        when = time.strftime("%H:%M:%S", time.localtime(d.time))
        what = escape(d.summary) if d.ok else f"[red]{escape(d.error or 'failed')}[/] ({escape(d.summary)})"
        decisions.add_row(when, d.policy, what, escape(d.reason))
    console.print(decisions)


def grpc_plan_source(timeout: float) -> PlanSource:
    """GetPlan over gRPC with ``timeout``."""

    async def get_plan(address: str) -> placement_pb2.PlacementPlan:
        async with open_channel(address) as channel:
            stub = placement_pb2_grpc.PlacementStub(channel)
            return await stub.GetPlan(placement_pb2.GetPlanRequest(), timeout=timeout)

    return get_plan
