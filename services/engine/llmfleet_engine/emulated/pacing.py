"""When an emulated step starts on the modelled clock (pure logic: every time is passed in).

The simulator starts a step when the previous one ends if work was waiting, else when work arrives.
The emulated engine keeps that timeline while the host spends its own Python time between steps
(completing one step, scheduling the next, other engines' threads in the same process):

* **Busy** (the previous step left work behind): the step starts at the previous step's due time,
  or at its earliest member's arrival if every member arrived later, never after ``now``. The host's
  time past the due time is recorded per step (``Lag.record_host``) and overlaps the modelled step
  instead of adding to it.
* **Idle** (the previous step left nothing, or no step has run since the clock restarted): the step
  starts at its earliest member's arrival when that is after the engine went idle and within the
  catch-up bound (the worker's wake-up is the host's time, not the GPU's), else at ``now``; a request
  that brings an older arrival (one migrated in with its age) never pulls the clock back to a stale
  due time.
* **Catch-up is bounded**: a start is never more than ``max_catchup_s`` before ``now``. A host that
  stalls (or is overloaded for good) runs at most that much modelled time with zero sleep; beyond it
  the modelled clock slips forward, and the slip is recorded (``Lag.record_slip``) next to the
  lateness of the waits themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet_engine.emulated.clock import Lag

DEFAULT_MAX_CATCHUP_S = 0.25  # about ten decode steps of a 7B model on an A100


@dataclass
class StepPacer:
    """The modelled clock of one emulated engine: the previous step's due time and whether the engine
    went idle after it."""

    lag: Lag
    max_catchup_s: float = DEFAULT_MAX_CATCHUP_S
    due: float | None = None  # when the previous step ends; None: the clock restarts at the next step
    idle_since: float | None = None  # when the engine found nothing left after the previous step

    def __post_init__(self) -> None:
        if self.max_catchup_s < 0:
            raise ValueError(f"max_catchup_s must be >= 0, got {self.max_catchup_s}")

    def start(self, now: float, ready: float) -> float:
        """The start of a step scheduled at ``now`` whose earliest member arrived at ``ready``."""
        due, floor = self.due, now - self.max_catchup_s
        if due is None or due > now:
            return now
        if self.idle_since is not None:  # idle: only work that arrived since dates the step
            return ready if self.idle_since <= ready <= now and ready >= floor else now
        if ready > due:  # busy, but every member arrived after the previous step ended
            start = min(ready, now)
        else:
            self.lag.record_host(now - due)
            start = due
        if start < floor:
            self.lag.record_slip(floor - start)
            return floor
        return start

    def begin(self, start: float, duration: float) -> float:
        """A step starting at ``start`` runs ``duration`` modelled seconds: its due time."""
        self.due = start + duration
        self.idle_since = None
        return self.due

    def ended(self, now: float, busy: bool) -> None:
        """The step is complete at ``now``; ``busy``: work is left for the next step."""
        if not busy and self.idle_since is None:
            self.idle_since = now

    def restart(self) -> None:
        """Work was there but no step could run: the next step starts at its own ``now``."""
        self.due = None
        self.idle_since = None
