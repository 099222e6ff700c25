"""A workload: timed requests with known prompt and output lengths, as the simulator replays them.

Times are float seconds from the workload's start (t = 0); lengths are int tokens. ``Workload`` keeps
its requests sorted by arrival, ties broken by request id with digit runs compared as numbers
(``r9`` before ``r10``), so a workload built from the same requests in any order is equal.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, SupportsIndex

import numpy as np

_DIGITS = re.compile(r"(\d+)")


def _as_int(name: str, value: SupportsIndex) -> int:
    """``value`` as an int; TypeError for a bool or a value without ``__index__`` (a field's annotation
    does not keep a caller from passing one)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


@dataclass(frozen=True)
class WorkloadRequest:
    """One request: when it arrives and how long its prompt and (true) output are.

    Optionally its prompt's content, for prefix caching and cache-aware dispatch
    (:mod:`llmfleet.workload.prompts` renders it as token ids or text): ``system_tokens`` leading
    tokens are its service's system prompt, and ``parts`` are the rest as seeded segments ``(seed,
    tokens)``, so prompts that share segments share a prefix. With content, ``system_tokens`` plus the
    parts' tokens is ``prompt_tokens``. ``output_seed``, when set, seeds its output's tokens: the
    answer the workload assumes the model gives (a conversation's next turn resends it), which lets
    a simulated engine cache the output's blocks as a live one caches its sampled tokens'. ``session`` names the conversation the request continues ("":
    none).

    A closed-loop turn names the request it ``follows``: a replay sends it ``think_s`` seconds after
    that request finished, as a chat user answers what they read (a turn whose predecessor failed is
    not sent: the conversation ends there). Its ``arrival_s`` is then the earliest it can arrive (its
    predecessor's arrival plus ``think_s``), which orders the workload and dates it when its
    predecessor is cut away (:meth:`Workload.window`)."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    service: str = "default"
    model: str = ""
    system_tokens: int = 0
    parts: tuple[tuple[int, int], ...] = ()
    session: str = ""
    follows: str = ""
    think_s: float = 0.0
    output_seed: int | None = None
    tenant: str = ""  # the API key it comes from: fair queueing counts tokens per tenant
    priority: int | None = None  # its own priority (None: its service's)

    @property
    def has_content(self) -> bool:
        """Whether the request says what its prompt holds (else only its length is known)."""
        return self.system_tokens > 0 or bool(self.parts)

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty str, got {self.request_id!r}")
        if isinstance(self.arrival_s, bool) or not isinstance(self.arrival_s, numbers.Real):
            raise TypeError(f"{self.request_id}: arrival_s must be a number, got {self.arrival_s!r}")
        arrival = float(self.arrival_s)
        if not math.isfinite(arrival) or arrival < 0:
            raise ValueError(f"{self.request_id}: arrival_s must be finite and >= 0, got {self.arrival_s!r}")
        prompt = _as_int("prompt_tokens", self.prompt_tokens)
        output = _as_int("output_tokens", self.output_tokens)
        if prompt < 0:
            raise ValueError(f"{self.request_id}: prompt_tokens must be >= 0, got {prompt}")
        if output < 1:
            raise ValueError(f"{self.request_id}: output_tokens must be >= 1, got {output}")
        if not isinstance(self.service, str) or not isinstance(self.model, str):
            raise TypeError(f"{self.request_id}: service and model must be str")
        object.__setattr__(self, "arrival_s", arrival)
        object.__setattr__(self, "prompt_tokens", prompt)
        object.__setattr__(self, "output_tokens", output)
        if self.system_tokens or self.parts:
            self._check_content(prompt)
        if not isinstance(self.session, str):
            raise TypeError(f"{self.request_id}: session must be a str, got {self.session!r}")
        if self.follows or self.think_s:
            self._check_follows()
        if not isinstance(self.tenant, str):
            raise TypeError(f"{self.request_id}: tenant must be a str, got {self.tenant!r}")
        if self.priority is not None:
            object.__setattr__(self, "priority", _as_int("priority", self.priority))
        if self.output_seed is not None:
            seed = _as_int("output_seed", self.output_seed)
            if not 0 <= seed < 2**64:
                raise ValueError(f"{self.request_id}: output_seed must be in [0, 2**64), got {seed}")
            object.__setattr__(self, "output_seed", seed)

    def _check_follows(self) -> None:
        if not isinstance(self.follows, str) or self.follows == self.request_id:
            raise ValueError(f"{self.request_id}: follows must name another request, got {self.follows!r}")
        if isinstance(self.think_s, bool) or not isinstance(self.think_s, numbers.Real):
            raise TypeError(f"{self.request_id}: think_s must be a number, got {self.think_s!r}")
        think = float(self.think_s)
        if not math.isfinite(think) or think < 0:
            raise ValueError(f"{self.request_id}: think_s must be finite and >= 0, got {self.think_s!r}")
        if think and not self.follows:
            raise ValueError(f"{self.request_id}: think_s needs follows (the request it waits for)")
        object.__setattr__(self, "think_s", think)

    def _check_content(self, prompt: int) -> None:
        system = _as_int("system_tokens", self.system_tokens)
        if system < 0:
            raise ValueError(f"{self.request_id}: system_tokens must be >= 0, got {system}")
        parts = []
        for part in self.parts:
            if len(part) != 2:
                raise ValueError(f"{self.request_id}: a part is (seed, tokens), got {part!r}")
            seed, n = _as_int("a part's seed", part[0]), _as_int("a part's tokens", part[1])
            if not 0 <= seed < 2**64 or n < 1:
                raise ValueError(
                    f"{self.request_id}: a part needs 0 <= seed < 2**64 and tokens >= 1, got {part!r}"
                )
            parts.append((seed, n))
        total = system + sum(n for _, n in parts)
        if total != prompt:
            raise ValueError(
                f"{self.request_id}: system_tokens + parts' tokens = {total}, but prompt_tokens = {prompt}"
            )
        object.__setattr__(self, "system_tokens", system)
        object.__setattr__(self, "parts", tuple(parts))


_OPTIONAL_FIELDS = {  # written only when not their default: plain workloads' files stay as they were
    "system_tokens": 0, "parts": (), "session": "", "follows": "", "think_s": 0.0, "output_seed": None,
    "tenant": "", "priority": None,
}  # fmt: skip


def _order_key(r: WorkloadRequest) -> tuple[float, tuple[str | int, ...]]:
    parts = _DIGITS.split(r.request_id)  # alternates str, digits, str, ...: same types line up
    return r.arrival_s, tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def _unlinked(reqs: Sequence[WorkloadRequest]) -> tuple[WorkloadRequest, ...]:
    """``reqs`` with each turn whose predecessor is not among them made a request of its own (sent at
    its ``arrival_s``)."""
    ids = {r.request_id for r in reqs}
    return tuple(
        r if not r.follows or r.follows in ids else replace(r, follows="", think_s=0.0) for r in reqs
    )


def _stats(values: Sequence[int]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
    }


@dataclass(frozen=True)
class Workload:
    """Requests sorted by (arrival, id); request ids are unique."""

    requests: tuple[WorkloadRequest, ...] = field(default=())

    def __post_init__(self) -> None:
        reqs = tuple(self.requests)
        for r in reqs:
            if not isinstance(r, WorkloadRequest):
                raise TypeError(f"Workload holds WorkloadRequest, got {type(r).__name__}")
        dups = sorted(i for i, c in Counter(r.request_id for r in reqs).items() if c > 1)
        if dups:
            raise ValueError(f"duplicate request_id(s): {dups[:5]}")
        ordered = tuple(sorted(reqs, key=_order_key))
        seen: set[str] = set()
        for r in ordered:
            if r.follows and r.follows not in seen:
                raise ValueError(f"{r.request_id} follows {r.follows!r}, which is not an earlier request")
            seen.add(r.request_id)
        object.__setattr__(self, "requests", ordered)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[WorkloadRequest]:
        return iter(self.requests)

    @property
    def duration_s(self) -> float:
        """Seconds from the workload's start (t = 0) to its last arrival; 0.0 when empty."""
        return self.requests[-1].arrival_s if self.requests else 0.0

    @property
    def closed_loop(self) -> bool:
        """Whether some request waits for another to finish (``follows``)."""
        return any(r.follows for r in self.requests)

    @property
    def rate_rps(self) -> float:
        """Requests per second over ``duration_s``; 0.0 when the duration is 0 (undefined)."""
        d = self.duration_s
        return len(self.requests) / d if d > 0 else 0.0

    def services(self) -> tuple[str, ...]:
        """Distinct service names, sorted."""
        return tuple(sorted({r.service for r in self.requests}))

    def by_service(self) -> dict[str, Workload]:
        """One workload per service, on the same timeline (arrivals are not re-based)."""
        groups: dict[str, list[WorkloadRequest]] = {}
        for r in self.requests:
            groups.setdefault(r.service, []).append(r)
        return {name: Workload(_unlinked(groups[name])) for name in sorted(groups)}

    def lengths(self) -> list[tuple[int, int]]:
        """(prompt_tokens, output_tokens) of each request, in arrival order."""
        return [(r.prompt_tokens, r.output_tokens) for r in self.requests]

    def window(self, start_s: float, end_s: float) -> Workload:
        """Requests arriving in [start_s, end_s), re-based so that start_s becomes t = 0."""
        if not (math.isfinite(start_s) and math.isfinite(end_s)) or not 0 <= start_s < end_s:
            raise ValueError(f"window needs 0 <= start_s < end_s (finite), got [{start_s}, {end_s})")
        kept = _unlinked([r for r in self.requests if start_s <= r.arrival_s < end_s])
        return Workload(tuple(replace(r, arrival_s=r.arrival_s - start_s) for r in kept))

    def head(self, n: int) -> Workload:
        """The first ``n`` requests by arrival."""
        if _as_int("n", n) < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return Workload(self.requests[:n])

    def to_jsonl(self, path: str | Path) -> None:
        """Write one JSON object per request (the ``WorkloadRequest`` fields), in arrival order."""
        with Path(path).open("w", encoding="utf-8") as f:
            for r in self.requests:
                obj = asdict(r)
                for key, default in _OPTIONAL_FIELDS.items():
                    if obj[key] == default:
                        del obj[key]
                f.write(json.dumps(obj) + "\n")

    @classmethod
    def from_jsonl(cls, path: str | Path) -> Workload:
        """Read what ``to_jsonl`` wrote; errors name the file and the 1-based line."""
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"workload file not found: {p}")
        reqs = []
        with p.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    if not isinstance(obj, dict):
                        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
                    reqs.append(WorkloadRequest(**obj))
                except (ValueError, TypeError) as e:
                    raise ValueError(f"{p}:{lineno}: bad workload request: {e}") from e
        return cls(tuple(reqs))

    def summary(self) -> dict[str, Any]:
        """Count, duration, rate, and mean/p50/p99 prompt and output tokens, overall and per service.

        A service's ``rate_rps`` is its count over the whole workload's ``duration_s``.
        """

        def describe(w: Workload) -> dict[str, Any]:
            out: dict[str, Any] = {
                "count": len(w),
                "rate_rps": len(w) / self.duration_s if self.duration_s else 0.0,
            }
            if len(w):
                out["prompt_tokens"] = _stats([r.prompt_tokens for r in w])
                out["output_tokens"] = _stats([r.output_tokens for r in w])
            return out

        return {
            "count": len(self),
            "duration_s": self.duration_s,
            "rate_rps": self.rate_rps,
            "all": describe(self),
            "services": {name: describe(w) for name, w in self.by_service().items()},
        }
