"""Dispatch interface shared by the scheduler service and the simulator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class NoCandidate(LookupError):
    """No engine can take the request (none hosts the model, or all were excluded)."""


@dataclass(frozen=True)
class EngineCandidate:
    """An engine as the dispatcher sees it: id, hosted models, and its latest load (if known)."""

    engine_id: str
    models: tuple[str, ...]
    running: int = 0
    waiting: int = 0
    kv_used_bytes: int = 0
    kv_capacity_bytes: int = 0


class DispatchPolicy(Protocol):
    name: str

    def choose(self, model: str, candidates: Sequence[EngineCandidate], exclude: frozenset[str] = ...) -> str:
        """Engine id for a request of ``model``; raises NoCandidate when none qualifies."""
        ...


def eligible(
    model: str, candidates: Sequence[EngineCandidate], exclude: frozenset[str]
) -> list[EngineCandidate]:
    """Candidates hosting ``model`` and not excluded, sorted by id (a stable order for every policy)."""
    out = sorted(
        (c for c in candidates if model in c.models and c.engine_id not in exclude), key=lambda c: c.engine_id
    )
    if not out:
        hosts = sorted(c.engine_id for c in candidates if model in c.models)
        why = f"all hosts excluded ({', '.join(hosts)})" if hosts else "no engine hosts it"
        raise NoCandidate(f"no engine available for model {model!r}: {why}")
    return out
