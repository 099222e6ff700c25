"""When ``llmfleet up`` restarts a child that exited, like systemd's ``Restart=on-failure`` with
``RestartSec`` backing off and ``StartLimitBurst`` / ``StartLimitIntervalSec``.

* A clean exit (code 0) is not restarted; a non-zero code or a signal is.
* The n-th consecutive failure waits ``min(max_backoff_s, backoff_s · 2^(n−1))`` before the restart;
  a child that ran at least ``stable_s`` before it failed starts the count again.
* ``burst`` failures within ``interval_s`` and the child is given up (left stopped, reported).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    burst: int = 5
    interval_s: float = 60.0
    stable_s: float = 30.0

    def __post_init__(self) -> None:
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError(
                f"need 0 <= backoff_s <= max_backoff_s, got {self.backoff_s}, {self.max_backoff_s}"
            )
        if self.burst < 1 or self.interval_s <= 0:
            raise ValueError(f"need burst >= 1 and interval_s > 0, got {self.burst}, {self.interval_s}")


@dataclass(frozen=True)
class Decision:
    restart_at: float | None  # None: do not restart
    reason: str  # "clean exit", "restart 2 in 2.0s", "gave up: 5 failures within 60s"
    attempt: int = 0

    @property
    def gave_up(self) -> bool:
        return self.restart_at is None and self.reason.startswith("gave up")


@dataclass
class _History:
    failures: deque[float] = field(default_factory=deque)  # when each recent failure happened
    consecutive: int = 0


@dataclass
class Restarts:
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    _children: dict[str, _History] = field(default_factory=dict)

    def on_exit(self, name: str, returncode: int, now: float, ran_s: float) -> Decision:
        """``name`` exited with ``returncode`` at ``now`` after running ``ran_s`` seconds."""
        if returncode == 0:
            return Decision(None, "clean exit")
        p, h = self.policy, self._children.setdefault(name, _History())
        h.consecutive = 1 if ran_s >= p.stable_s else h.consecutive + 1
        h.failures.append(now)
        while h.failures and h.failures[0] < now - p.interval_s:
            h.failures.popleft()
        if len(h.failures) >= p.burst:
            return Decision(None, f"gave up: {len(h.failures)} failures within {p.interval_s:g}s")
        wait = min(p.max_backoff_s, p.backoff_s * 2 ** (h.consecutive - 1))
        return Decision(now + wait, f"restart {h.consecutive} in {wait:.1f}s", h.consecutive)
