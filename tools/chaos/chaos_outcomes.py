"""What the clients of a chaos or soak run saw: one :class:`Outcome` per request, the reference it
is judged against, and the tallies the reports are made of."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Outcome:
    """One request as its client saw it."""

    path: str  # "sdk" | "http"
    phase: int
    prompt: int
    max_tokens: int
    started: float
    ended: float = 0.0
    ttft_s: float | None = None
    server_ttft_s: float | None = None  # SDK: the scheduler's own TTFT (usage.ttft_s)
    server_queue_s: float | None = None  # SDK: usage.queue_s
    status: str = "running"  # ok | error | lost | duplicated | gapped | wrong
    retries: int = 0
    error: str = ""
    tokens: int = 0


@dataclass
class Reference:
    """The uninterrupted greedy output of every (prompt index, max_tokens): token ids and text."""

    token_ids: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    text: dict[tuple[int, int], str] = field(default_factory=dict)


def judge(o: Outcome, reference: Reference | None, tokens: Sequence[int] | None, text: str | None) -> None:
    """Set ``o.status`` (and ``o.error`` when not ok) from what the client received: the token ids
    (SDK) or the text (HTTP) against ``reference``; without one, only the token count."""
    if reference is None:
        o.status = (
            "ok" if o.tokens == o.max_tokens else ("duplicated" if o.tokens > o.max_tokens else "gapped")
        )
        return
    key = (o.prompt, o.max_tokens)
    if tokens is not None:
        want = reference.token_ids[key]
        if list(tokens) == list(want):
            o.status = "ok"
        elif len(tokens) > len(want):
            o.status = "duplicated"
        elif len(tokens) < len(want):
            o.status = "gapped"
        else:
            o.status = "wrong"
    else:
        want_text = reference.text[key]
        if text == want_text and o.tokens == o.max_tokens:
            o.status = "ok"
        elif o.tokens > o.max_tokens or (text is not None and len(text) > len(want_text)):
            o.status = "duplicated"
        elif o.tokens < o.max_tokens or (text is not None and len(text) < len(want_text)):
            o.status = "gapped"
        else:
            o.status = "wrong"
    if o.status != "ok":
        o.error = f"{o.status}: got {o.tokens} tokens, want {o.max_tokens}"


def counts(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Requests started, completed, lost, duplicated / gapped / wrong, errors and retries, in all and
    per path (``sdk``, ``http``), with up to five example failures."""
    by = {
        s: sum(o.status == s for o in outcomes)
        for s in ("ok", "error", "lost", "duplicated", "gapped", "wrong", "running")
    }
    out: dict[str, Any] = {"started": len(outcomes), "completed": by["ok"]}
    out.update({k: v for k, v in by.items() if k not in ("ok", "running")})
    out["retries"] = sum(o.retries for o in outcomes)
    out["retried_requests"] = sum(o.retries > 0 for o in outcomes)
    errors = [o.error for o in outcomes if o.status != "ok"]
    out["examples"] = sorted(set(errors))[:5]
    for path in ("sdk", "http"):
        sub = [o for o in outcomes if o.path == path]
        out[path] = {
            "started": len(sub),
            "completed": sum(o.status == "ok" for o in sub),
            "lost": sum(o.status == "lost" for o in sub),
            "dup_gap_wrong": sum(o.status in ("duplicated", "gapped", "wrong") for o in sub),
            "errors": sum(o.status == "error" for o in sub),
            "retries": sum(o.retries for o in sub),
        }
    return out


def max_stall(times: Sequence[float], start: float, end: float) -> float:
    """The longest gap between ``start``, the token ``times`` in between and ``end``."""
    pts = [start, *[t for t in times if start <= t <= end], end]
    return max((b - a for a, b in itertools.pairwise(pts)), default=0.0)
