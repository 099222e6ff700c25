"""Closed-loop turns in a replay: a request that ``follows`` another is sent ``think_s`` after that
request finished (:class:`~llmfleet.workload.request.WorkloadRequest`). The simulator and
``llmfleet load`` both keep their turns here.

A turn read before its predecessor finished waits; a turn read after is released at once (the
simulator reads its workload one request ahead, in order of earliest arrival). A released turn is a
copy of itself with ``arrival_s`` set to when it is sent, so its TTFT and latency count from then. A
turn whose predecessor failed is never sent: at the end of the replay it is reported failed with
:data:`PREDECESSOR_FAILED`, as is every turn after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

PREDECESSOR_FAILED = "its conversation's previous turn failed, so it was never sent"


@dataclass
class FollowUps:
    """Turns waiting for their predecessors; ``release(turn)`` schedules a turn's arrival."""

    followed: frozenset[str]  # ids that some turn follows
    release: Callable[[Any], None]
    waiting: dict[str, list[Any]] = field(default_factory=dict)  # predecessor id -> its turns read so far
    finished: dict[str, float] = field(default_factory=dict)  # followed ids that finished, and when
    in_think: int = 0  # turns released and not yet arrived

    @classmethod
    def of(cls, requests: Iterable[Any], release: Callable[[Any], None]) -> FollowUps | None:
        """The bookkeeping for ``requests``, or None when no request follows another."""
        followed = frozenset(f for r in requests if (f := getattr(r, "follows", "")))
        return cls(followed, release) if followed else None

    def read(self, turn: Any) -> None:
        """``turn`` (which follows another) was read from the workload."""
        end = self.finished.get(turn.follows)
        if end is None:
            self.waiting.setdefault(turn.follows, []).append(turn)
        else:
            self._release(turn, end)

    def ended(self, request_id: str, now: float) -> None:
        """``request_id`` finished at ``now``: its turns are released."""
        if request_id not in self.followed:
            return
        self.finished[request_id] = now
        for turn in self.waiting.pop(request_id, ()):
            self._release(turn, now)

    def arrived(self) -> None:
        """A released turn arrived."""
        self.in_think -= 1

    def stranded(self) -> list[Any]:
        """The turns never released (their predecessor failed or never ended), in reading order."""
        return [t for turns in self.waiting.values() for t in turns]

    def _release(self, turn: Any, end: float) -> None:
        self.in_think += 1
        self.release(replace(turn, arrival_s=end + turn.think_s))
