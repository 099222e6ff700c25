"""``llmfleet up`` after start-up: a child that exits is reported with its log tail while the rest keep
running, and started again per the restart policy (:mod:`llmfleet.supervisor_restart`); its row in
``endpoints.json`` follows (``restarted``, ``gave up``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from llmfleet.cli.up_start import UpSession
from llmfleet.supervisor import Child, SupervisorError, describe_returncode
from llmfleet.supervisor_restart import Decision, Restarts


def warn_exit(
    console: Console, name: str, pid: int, rc: int | None, log_path: Path, log_tail: str, decision: Decision
) -> None:
    console.print(
        f"[bold red]warning:[/] {escape(name)} (pid {pid}) exited with {describe_returncode(rc)}; "
        f"{escape(decision.reason)}; the rest keep running. Last lines of {escape(str(log_path))}:"
    )
    console.print(escape(log_tail), style="dim", highlight=False)


@dataclass
class Supervision:
    """Watches the session's children; ``restarts`` None: a child that exits stays stopped."""

    session: UpSession
    restarts: Restarts | None
    due: dict[str, float] = field(default_factory=dict)  # child -> when to start it again

    def run_forever(self, interval_s: float = 0.2) -> None:
        """Report exits and restart children until interrupted (KeyboardInterrupt)."""
        while True:
            self.check_exits()
            self.restart_due()
            time.sleep(interval_s)

    def _decide(self, child: Child, rc: int) -> Decision:
        if self.restarts is None:
            return Decision(None, "restarts off (--no-restart)")
        return self.restarts.on_exit(child.name, rc, time.monotonic(), time.time() - child.started_at)

    def check_exits(self) -> None:
        """Report each child that exited since the last look, and schedule its restart (or give up)."""
        s = self.session
        for child in s.group.poll_exited():
            if child.pid in s.reported:
                continue
            s.reported.add(child.pid)
            rc = child.returncode if child.returncode is not None else -1
            decision = self._decide(child, rc)
            warn_exit(s.console, child.name, child.pid, rc, child.log_path, child.log_tail(), decision)
            if decision.restart_at is not None:
                self.due[child.name] = decision.restart_at
            elif decision.gave_up:
                s.row(child.name)["status"] = "gave up"
                s.write_endpoints()

    def restart_due(self) -> None:
        """Start again each child whose restart time has come."""
        s = self.session
        for name, at in list(self.due.items()):
            if time.monotonic() < at:
                continue
            del self.due[name]
            try:
                child = s.group.respawn(name)
            except SupervisorError as e:
                s.console.print(f"[bold red]error:[/] cannot restart {escape(name)}: {escape(str(e))}")
                continue
            s.console.print(f"restarted {escape(name)} (pid {child.pid}, restart {child.restarts})")
            s.row(name).update(pid=child.pid, status="restarted", restarts=child.restarts)
            s.write_endpoints()
