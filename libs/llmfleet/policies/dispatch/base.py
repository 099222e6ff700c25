"""Dispatch interface shared by the scheduler service and the simulator.

``choose(model, candidates, exclude, request)`` picks an engine for one request. ``request`` carries what
load-aware policies need (prompt length, predicted output, KV bytes per token); policies that only need
the model ignore it, and callers that know nothing more may leave it ``None``.

Optional class attributes tell callers what a policy reads, so they can skip work or keep it exact:
``uses_predictions`` (asks for predicted lengths), ``uses_kv_load`` (reads ``kv_used_bytes``: no
fast-forward in the simulator), ``load_blind`` (reads no load at all: no refresh, and a simulation may
be split across processes), and an ``on_finish(request_id, engine_id, output_tokens, now)`` method
for policies that track what they placed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class NoCandidate(LookupError):
    """No engine can take the request (none hosts the model, or all were excluded)."""


@dataclass(frozen=True)
class EngineCandidate:
    """An engine as the dispatcher sees it: id, hosted models, and its latest load (if known).

    ``running``/``waiting`` count requests; ``kv_used_bytes``/``kv_capacity_bytes`` describe its KV pool
    (capacity 0 means unknown).
    """

    engine_id: str
    models: tuple[str, ...]
    running: int = 0
    waiting: int = 0
    kv_used_bytes: int = 0
    kv_capacity_bytes: int = 0
    # requests on the engine, running or waiting (the JSQ queue length); a plain attribute, not a
    # property, so scans over 1,000 candidates (min by queue) read it at C speed
    queued: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "queued", self.running + self.waiting)

    @property
    def kv_free_bytes(self) -> int:
        return max(0, self.kv_capacity_bytes - self.kv_used_bytes)


@dataclass(frozen=True)
class DispatchRequest:
    """What a dispatcher may know about one request (no oracle: ``predicted_output_tokens`` is a guess)."""

    request_id: str
    model: str
    service: str = ""
    prompt_tokens: int = 0
    predicted_output_tokens: float = 0.0
    kv_bytes_per_token: int = 0
    arrival_s: float = 0.0

    @property
    def kv_need_bytes(self) -> int:
        """KV bytes the request is expected to hold at its end: (prompt + predicted output) · bytes/token."""
        return int((self.prompt_tokens + self.predicted_output_tokens) * self.kv_bytes_per_token)


class DispatchPolicy(Protocol):
    name: str

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = ...,
        request: DispatchRequest | None = ...,
    ) -> str:
        """Engine id for a request of ``model``; raises NoCandidate when none qualifies."""
        ...


class HostList(list):
    """Candidates known to host ``model``, sorted by engine id: callers that keep per-model lists (the
    simulator with 1,000 engines) pass one so :func:`eligible` need not filter and sort per request."""

    def __init__(self, model: str, items: Sequence[EngineCandidate] = ()) -> None:
        super().__init__(items)
        self.model = model


def eligible(
    model: str, candidates: Sequence[EngineCandidate], exclude: frozenset[str]
) -> Sequence[EngineCandidate]:
    """Candidates hosting ``model`` and not excluded, sorted by id (a stable order for every policy).

    A :class:`HostList` for ``model`` with nothing excluded is returned as it is (do not mutate it)."""
    if not exclude and isinstance(candidates, HostList) and candidates.model == model and candidates:
        return candidates
    out = sorted(
        (c for c in candidates if model in c.models and c.engine_id not in exclude), key=lambda c: c.engine_id
    )
    if not out:
        hosts = sorted(c.engine_id for c in candidates if model in c.models)
        why = f"all hosts excluded ({', '.join(hosts)})" if hosts else "no engine hosts it"
        raise NoCandidate(f"no engine available for model {model!r}: {why}")
    return out
