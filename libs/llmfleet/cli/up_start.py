"""The start-up steps of ``llmfleet up`` on one :class:`UpSession`: start (or attach to) etcd, wait for
every child's gRPC health, wait until every service can be served, then show the endpoints (a table,
and ``<state-dir>/endpoints.json``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llmfleet.cli.up_plan import ServicePlan
from llmfleet.cli.up_ready import wait_servable
from llmfleet.config import DEFAULT_PREFIX
from llmfleet.coord.keys import Keys
from llmfleet.coord.local_etcd import LocalEtcd
from llmfleet.supervisor import ProcessGroup, SupervisorError


@dataclass
class UpSession:
    """One run of ``llmfleet up``: where it prints, its state directory, its children, the etcd it
    started (None: an external one) and the endpoint rows it reports."""

    console: Console
    state: Path
    group: ProcessGroup
    etcd: LocalEtcd | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    reported: set[int] = field(default_factory=set)  # pids whose exit was already reported

    def row(self, name: str) -> dict[str, Any]:
        return next(r for r in self.rows if r["name"] == name)

    def write_endpoints(self) -> None:
        tmp = self.state / "endpoints.json.tmp"  # renamed into place: a reader never sees half of it
        tmp.write_text(json.dumps({r["name"]: r for r in self.rows}, indent=2) + "\n")
        tmp.replace(self.state / "endpoints.json")


def forget_nodes(etcd: Any, prefix: str | None) -> None:
    """Drop the node records a previous ``up`` left in its own etcd. etcd restores leases with a fresh
    TTL when it restarts, so the last run's engines would look alive, with their models loaded, for a
    whole TTL: the scheduler would call the cluster servable before any engine of this run exists.
    Every process of that run is gone (``up`` stopped them), so their records are stale."""

    key = Keys(prefix or DEFAULT_PREFIX).nodes
    subprocess.run(
        [str(etcd.etcdctl_path()), "--endpoints", etcd.endpoint, "del", "--prefix", key],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip


def start_etcd(s: UpSession, args: argparse.Namespace) -> str | None:
    """The etcd endpoint: ``--etcd``, else a local etcd started under the state dir (its stale node
    records dropped); None when it did not start (said on the console)."""
    if args.etcd:
        s.rows.append({"name": "etcd", "address": args.etcd, "pid": None, "status": "external", "log": None})
        return str(args.etcd)

    s.etcd = etcd = LocalEtcd(s.state / "etcd", client_port=args.etcd_port)
    s.console.print(f"starting etcd on {etcd.endpoint} (data {s.state / 'etcd'}) ...")
    try:
        etcd.start(timeout=30)
    except RuntimeError as e:
        s.console.print(f"[red]error:[/] etcd did not start: {escape(str(e))}")
        return None
    forget_nodes(etcd, args.prefix)
    s.rows.append(
        {
            "name": "etcd",
            "address": etcd.endpoint,
            "pid": etcd.pid,
            "status": "healthy",
            "log": str(etcd.log_path),
        }
    )
    return etcd.endpoint


def wait_healthy(s: UpSession, plans: list[ServicePlan], timeout_s: float) -> None:
    """Wait (``timeout_s`` for all) until each child answers SERVING; a row each, with its status."""
    deadline = time.monotonic() + timeout_s
    for plan in plans:
        child = s.group[plan.name]
        try:
            s.group.wait_healthy(child, plan.address, timeout=max(0.5, deadline - time.monotonic()))
            status = "healthy"
        except SupervisorError as e:
            status = "exited" if not child.alive else "unhealthy"
            if not child.alive:
                s.reported.add(child.pid)
            s.console.print(f"[bold red]warning:[/] {escape(str(e).splitlines()[0])}")
            s.console.print(escape(child.log_tail()), style="dim", highlight=False)
        s.rows.append(
            {
                "name": plan.name,
                "address": plan.address,
                "metrics": plan.metrics,
                **({"http": plan.http} if plan.http else {}),
                "pid": child.pid,
                "status": status,
                "log": str(plan.log_path),
            }
        )


def wait_ready(s: UpSession, scheduler: ServicePlan, timeout_s: float) -> None:
    """Once every process is healthy, wait (``timeout_s``, 0: not at all) until every service can be
    served, showing the services still waiting for an engine; a warning when that does not happen."""
    if not (timeout_s > 0 and all(r["status"] == "healthy" for r in s.rows)):
        return
    s.console.print("every process is healthy; waiting until every service can be served ...")
    ready, missing = wait_servable(
        scheduler.address,
        timeout_s,
        alive=lambda: s.group[scheduler.name].alive,
        show=lambda line: s.console.print(escape(line), highlight=False),
    )
    if not ready:
        s.console.print(
            f"[bold red]warning:[/] not servable after {timeout_s:g}s; no engine serves "
            f"{escape(', '.join(missing) or '?')} (see {escape(str(s.state / 'logs'))}/placement.log)"
        )


def endpoints_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="llmfleet is up", title_justify="left")
    for col in ("name", "address", "metrics", "pid", "status"):
        table.add_column(col, no_wrap=True)
    table.add_column("log", overflow="fold")
    for r in rows:
        colour = {"healthy": "green", "external": "cyan"}.get(r["status"], "red")
        table.add_row(
            r["name"],
            r["address"],
            r.get("metrics") or "-",
            str(r["pid"] or "-"),
            f"[{colour}]{r['status']}[/]",
            escape(r["log"] or "-"),
        )
    return table


def announce(s: UpSession, etcd: str, schedulers: list[ServicePlan], tls: bool, http_api: str = "") -> None:
    """Show the endpoints (table and ``endpoints.json``) and where users connect (``http_api``: the
    OpenAI-compatible API's host:port, "" when none)."""
    s.console.print(endpoints_table(s.rows))
    s.write_endpoints()
    scheme = "https" if tls else "http"
    http = f"   openai: {scheme}://{http_api}/v1" if http_api else ""
    addresses = ",".join(p.address for p in schedulers)
    s.console.print(f"etcd: {etcd}   scheduler: {addresses}{http}   Ctrl-C to stop")
