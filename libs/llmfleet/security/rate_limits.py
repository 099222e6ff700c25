"""Per-key rate limits: token buckets for requests/s and tokens/min, O(1) per request, no threads.

A key with ``limits`` (see :mod:`llmfleet.security.api_keys`) gets up to two buckets:

- **requests**: refills ``requests_per_s`` a second up to ``burst`` (default: one second's worth,
  at least 1); each request takes 1.
- **tokens**: refills ``tokens_per_min / 60`` a second up to ``tokens_per_min``; each request takes
  the tokens its caller counts for it, and may get back the unused part when it ends
  (:meth:`KeyRateLimiter.give_back`). A request larger than the whole budget passes only on a full
  bucket, which it leaves in debt, so the long-run rate still holds.

A request passes only when every bucket of its key has room, and then takes from all of them: a
refused request costs nothing. Buckets refill lazily from the clock at each call (no timers, no
locks: one event loop). Each process enforces the ``share`` of a key's limits it is given (the
fractions of its rate and burst, :mod:`llmfleet.security.limit_shares`: scheduler replicas split a
key's limits by demand); a change of limits or share rescales the buckets and keeps their level
(clipped to the new capacity), so it never hands out a fresh burst.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KeyLimits:
    """One key's limits; None: that limit is off."""

    requests_per_s: float | None = None
    burst: int | None = None  # requests at once (default: max(1, ceil(requests_per_s)))
    tokens_per_min: int | None = None

    @property
    def request_burst(self) -> int:
        if self.burst is not None:
            return self.burst
        return max(1, math.ceil(self.requests_per_s or 0))


class RateLimited(Exception):
    """A request over its key's limit: ``limit`` is ``requests`` or ``tokens``; ``retry_after_s`` is the
    wait until it would pass, in whole seconds (at least 1, as HTTP's ``Retry-After`` needs)."""

    def __init__(self, key: str, limit: str, what: str, wait_s: float) -> None:
        self.key = key
        self.limit = limit
        self.wait_s = wait_s
        self.retry_after_s = max(1, math.ceil(wait_s))
        super().__init__(
            f"API key {key!r} is over its rate limit ({what}); retry after {self.retry_after_s}s"
        )


@dataclass(slots=True)
class TokenBucket:
    rate: float  # refill per second
    capacity: float
    level: float
    at: float  # clock of the last refill

    def refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
            self.at = now

    def wait_s(self, cost: float) -> float:
        """Seconds until ``cost`` fits (0: it fits now); more than the capacity needs a full bucket."""
        need = min(cost, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def give(self, n: float) -> None:
        self.level = min(self.capacity, self.level + n)

    def rescale(self, rate: float, capacity: float, now: float) -> None:
        self.refill(now)
        self.rate, self.capacity = rate, capacity
        self.level = min(self.level, capacity)


@dataclass(slots=True)
class _KeyState:
    limits: KeyLimits
    share: tuple[float, float]
    requests: TokenBucket | None
    tokens: TokenBucket | None


@dataclass
class KeyRateLimiter:
    """Buckets per key name, made on first use and rescaled when the key's limits or share change."""

    clock: Callable[[], float] = time.monotonic
    _keys: dict[str, _KeyState] = field(default_factory=dict)

    def take(
        self, key: str, limits: KeyLimits, tokens: int = 0, share: tuple[float, float] = (1.0, 1.0)
    ) -> None:
        """Count one request of ``tokens`` tokens for ``key``, or raise :class:`RateLimited` (then
        nothing is counted) naming the limit that needs the longer wait. ``share``: the fractions of
        the key's (requests, tokens) limits this process enforces."""
        now = self.clock()
        s = self._keys.get(key)
        if s is None:
            s = self._keys[key] = _new_state(limits, share, now)
        elif (s.limits is not limits and s.limits != limits) or s.share != share:
            s = self._keys[key] = _rescaled(s, limits, share, now)
        r, t = s.requests, s.tokens
        wait_r = wait_t = 0.0
        if r is not None:
            r.refill(now)
            wait_r = r.wait_s(1)
        if t is not None:
            t.refill(now)
            wait_t = t.wait_s(tokens)
        if wait_r or wait_t:
            if wait_r >= wait_t:
                what = f"{limits.requests_per_s:g} requests/s, burst {limits.request_burst}"
                raise RateLimited(key, "requests", what, wait_r)
            what = f"{limits.tokens_per_min} tokens/min; this request counts {tokens}"
            raise RateLimited(key, "tokens", what, wait_t)
        if r is not None:
            r.level -= 1
        if t is not None:
            t.level -= tokens

    def give_back(self, key: str, tokens: int) -> None:
        """Return ``tokens`` of what ``key`` took (a request that used less than it counted)."""
        s = self._keys.get(key)
        if s is not None and s.tokens is not None and tokens > 0:
            s.tokens.give(tokens)


def _sizes(
    limits: KeyLimits, share: tuple[float, float]
) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """(rate, capacity) of the requests and the tokens bucket under ``share`` (None: limit off)."""
    requests = tokens = None
    if limits.requests_per_s is not None:
        requests = (limits.requests_per_s * share[0], limits.request_burst * share[0])
    if limits.tokens_per_min is not None:
        tokens = (limits.tokens_per_min / 60.0 * share[1], limits.tokens_per_min * share[1])
    return requests, tokens


def _bucket(size: tuple[float, float] | None, now: float) -> TokenBucket | None:
    return None if size is None else TokenBucket(size[0], size[1], size[1], now)


def _new_state(limits: KeyLimits, share: tuple[float, float], now: float) -> _KeyState:
    requests, tokens = _sizes(limits, share)
    return _KeyState(limits, share, _bucket(requests, now), _bucket(tokens, now))


def _rescaled(s: _KeyState, limits: KeyLimits, share: tuple[float, float], now: float) -> _KeyState:
    """``s`` under new limits or share: buckets keep their level (clipped); a limit turned on starts full."""
    fresh = _new_state(limits, share, now)
    for old, new in ((s.requests, fresh.requests), (s.tokens, fresh.tokens)):
        if old is not None and new is not None:
            old.rescale(new.rate, new.capacity, now)
    return _KeyState(
        limits,
        share,
        s.requests if s.requests is not None and fresh.requests is not None else fresh.requests,
        s.tokens if s.tokens is not None and fresh.tokens is not None else fresh.tokens,
    )
