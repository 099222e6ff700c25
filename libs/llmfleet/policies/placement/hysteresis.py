"""Do not flap: when a re-plan's target takes effect (shared by the live leader and the simulator).

A changed target is applied once the planner proposed the same target ``confirm`` intervals in a row;
an *urgent* target is applied at once: one that serves a model the state in force leaves unserved (an
engine died, a new service), or one that only adds engines to models whose requests are held for
capacity now (:func:`grows_for`: a burst waiting in the schedulers). ``confirm = 1`` applies
every change at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


def newly_served(
    current: Mapping[str, Sequence[str]],
    target: Mapping[str, Sequence[str]],
    needed: Iterable[str] | None = None,
) -> set[str]:
    """Models (among ``needed``, default all) the target serves and the current state does not."""
    have = {m for ms in current.values() for m in ms}
    gain = {m for ms in target.values() for m in ms} - have
    return gain if needed is None else gain & set(needed)


def grows_for(
    current: Mapping[str, Sequence[str]], target: Mapping[str, Sequence[str]], backlogged: Iterable[str]
) -> set[str]:
    """Models among ``backlogged`` that gain an engine when the target only adds: no engine loses a
    model (a scale-out cannot flap a running service away; removals wait for confirmation)."""
    if any(set(ms) - set(target.get(e, ())) for e, ms in current.items()):
        return set()
    wanted = set(backlogged)
    gain: set[str] = set()
    for e, ms in target.items():
        gain |= (set(ms) - set(current.get(e, ()))) & wanted
    return gain


@dataclass
class Hysteresis:
    confirm: int = 2
    candidate: object = None
    seen: int = 0

    def __post_init__(self) -> None:
        if self.confirm < 1:
            raise ValueError(f"confirm must be >= 1, got {self.confirm}")

    def decide(self, target: object, urgent: bool) -> bool:
        """Count ``target`` (a changed proposal, compared by ==); True = apply it now."""
        if target == self.candidate:
            self.seen += 1
        else:
            self.candidate, self.seen = target, 1
        if urgent or self.seen >= self.confirm:
            self.reset()
            return True
        return False

    def reset(self) -> None:
        self.candidate, self.seen = None, 0
