"""Admission control: per-service bounds on waiting requests and queued tokens.

A request *waits* from admission until its first token (queued here or at an engine). Its *queued
tokens* are its prompt, estimated by :class:`llmfleet.token_estimate.PromptTokens` (the
scheduler holds no tokenizer; rate limits, dispatch and the SCLS pool use the same estimate), plus its ``max_tokens``: the KV it may grow to. Past either bound a request is refused at
once with RESOURCE_EXHAUSTED (HTTP 429) and a retry-after, so an overload never queues without bound
or runs a process out of memory; one request larger than the token bound alone is still admitted
into an empty queue (else it could never run).

The retry-after is the time the queue needs to make room at its recent drain rate: the number of
requests that must leave it, over the requests per second that left it in the last ``window_s``
(clamped to [1, 60] s; 5 s when none left in the window).

**Lowest priority first.** Before it refuses a request, admission asks ``displace`` (the capacity
gate's) to refuse in its place the held request of the same service that would leave after it (a
lower priority; with fair queueing, the same priority from an API key served more tokens); when one is,
the request is admitted (the displaced one leaves the counts when its record fails, on the event
loop's next turn)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_MAX_WAITING = 1024
DEFAULT_MAX_QUEUED_TOKENS = 4_000_000


class Overloaded(Exception):
    def __init__(self, service: str, what: str, retry_after_s: int) -> None:
        super().__init__(f"service {service!r} is overloaded ({what}); retry after {retry_after_s}s")
        self.service = service
        self.retry_after_s = retry_after_s


@dataclass
class _Queue:
    service: str
    observe: Callable[[str, int], None] | None = None  # (service, waiting) on every change (a gauge)
    waiting: int = 0
    tokens: int = 0
    left: deque[float] = field(default_factory=deque)  # when requests stopped waiting (recent window)


@dataclass
class Ticket:
    """One admitted request's place; ``release()`` (idempotent) at its first token or its end."""

    _queue: _Queue
    tokens: int
    _clock: Callable[[], float]
    released: bool = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        q = self._queue
        q.waiting -= 1
        q.tokens -= self.tokens
        q.left.append(self._clock())
        if q.observe is not None:
            q.observe(q.service, q.waiting)


@dataclass
class Admission:
    max_waiting: int = DEFAULT_MAX_WAITING
    max_queued_tokens: int = DEFAULT_MAX_QUEUED_TOKENS
    window_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    observe: Callable[[str, int], None] | None = None  # (service, waiting) on every change
    # (service, priority, API key, retry-after s): refuse a held request of the service that would
    # leave after a new one of that priority and key, in its place; True when one was
    displace: Callable[[str, int, str, int], bool] | None = None
    _queues: dict[str, _Queue] = field(default_factory=dict)

    def admit(
        self,
        service: str,
        tokens: int,
        max_waiting: int = 0,
        max_queued_tokens: int = 0,
        priority: int = 0,
        key: str = "",
    ) -> Ticket:
        """Admit a request of ``tokens`` queued tokens, ``priority`` and API key ``key``, or raise
        :class:`Overloaded`. ``max_*`` are the service's own bounds (0: this scheduler's)."""
        q = self._queues.get(service)
        if q is None:
            q = self._queues[service] = _Queue(service, self.observe)
        waiting_cap = max_waiting or self.max_waiting
        token_cap = max_queued_tokens or self.max_queued_tokens
        over = None
        if q.waiting >= waiting_cap:
            over = (f"{q.waiting} requests waiting, limit {waiting_cap}",
                    self._retry_after(q, q.waiting - waiting_cap + 1))  # fmt: skip
        elif q.waiting and q.tokens + tokens > token_cap:
            over = (f"{q.tokens} + {tokens} queued tokens, limit {token_cap}", self._retry_after(q, 1))
        if over is not None and not (
            self.displace is not None and self.displace(service, priority, key, over[1])
        ):
            raise Overloaded(service, *over)
        q.waiting += 1
        q.tokens += tokens
        if q.observe is not None:
            q.observe(service, q.waiting)
        return Ticket(q, tokens, self.clock)

    def waiting(self, service: str) -> tuple[int, int]:
        """(requests, tokens) waiting for ``service``."""
        q = self._queues.get(service)
        return (q.waiting, q.tokens) if q else (0, 0)

    def _retry_after(self, q: _Queue, must_leave: int) -> int:
        now = self.clock()
        while q.left and q.left[0] < now - self.window_s:
            q.left.popleft()
        if not q.left:
            return 5
        rate = len(q.left) / self.window_s
        return int(min(60, max(1, math.ceil(must_leave / rate))))
