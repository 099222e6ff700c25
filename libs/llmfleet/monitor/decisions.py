"""The placement leader's decision log: what each run of the control loop decided, and why.

The controller appends a :class:`Decision` to ``PlacementServicer.decisions`` (a bounded
:func:`decision_log`); GetPlan returns them (oldest first) and ``llmfleet status`` shows the last ones.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

DECISION_LOG_SIZE = 100


@dataclass(frozen=True)
class Decision:
    """One placement decision. ``time``: unix seconds (for people; the caller reads the clock)."""

    time: float
    policy: str
    summary: str  # what changed, e.g. "engine-3: + tiny-llama; GPUs 3 -> 4"
    reason: str = ""  # why, e.g. "chat: attainment 0.62 < 0.90 over 60 s"
    ok: bool = True
    error: str = ""  # when not ok: e.g. the infeasible plan's message (the last good plan stays)

    @classmethod
    def failed(cls, time: float, policy: str, error: str, reason: str = "") -> Decision:
        return cls(time, policy, "kept the last good plan", reason, ok=False, error=error)


def decision_log(maxlen: int = DECISION_LOG_SIZE) -> deque[Decision]:
    """An empty log keeping the last ``maxlen`` decisions."""
    return deque(maxlen=maxlen)
