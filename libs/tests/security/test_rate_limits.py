"""Per-key token buckets: refill, burst, tokens/min, the retry-after, and keys that do not share."""

from __future__ import annotations

import pytest
from llmfleet.security import KeyLimits, KeyRateLimiter, RateLimited


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def refused(limiter: KeyRateLimiter, key: str, limits: KeyLimits, tokens: int = 0) -> RateLimited:
    with pytest.raises(RateLimited) as e:
        limiter.take(key, limits, tokens)
    return e.value


def test_burst_then_refill_at_the_rate():
    clock = Clock()
    lim = KeyRateLimiter(clock)
    limits = KeyLimits(requests_per_s=10, burst=5)
    for _ in range(5):
        lim.take("a", limits)
    e = refused(lim, "a", limits)
    assert e.key == "a" and e.limit == "requests"
    assert e.wait_s == pytest.approx(0.1) and e.retry_after_s == 1  # whole seconds, at least 1
    assert "'a'" in str(e) and "10 requests/s, burst 5" in str(e) and "retry after 1s" in str(e)
    clock.t += 0.25  # 2.5 requests' worth
    lim.take("a", limits)
    lim.take("a", limits)
    refused(lim, "a", limits)
    clock.t += 100  # refills up to the burst, no further
    for _ in range(5):
        lim.take("a", limits)
    refused(lim, "a", limits)


def test_default_burst_is_one_seconds_worth():
    assert KeyLimits(requests_per_s=20).request_burst == 20
    assert KeyLimits(requests_per_s=0.5).request_burst == 1
    assert KeyLimits(requests_per_s=2.5).request_burst == 3
    clock = Clock()
    lim = KeyRateLimiter(clock)
    slow = KeyLimits(requests_per_s=0.25)
    lim.take("a", slow)
    e = refused(lim, "a", slow)
    assert e.wait_s == pytest.approx(4.0) and e.retry_after_s == 4


def test_tokens_per_minute_and_give_back():
    clock = Clock()
    lim = KeyRateLimiter(clock)
    limits = KeyLimits(tokens_per_min=600)  # 10 tokens/s, a minute's worth at once
    lim.take("a", limits, 400)
    lim.take("a", limits, 200)
    e = refused(lim, "a", limits, 50)
    assert e.limit == "tokens" and e.wait_s == pytest.approx(5.0) and e.retry_after_s == 5
    assert "600 tokens/min; this request counts 50" in str(e)
    clock.t += 2.5  # 25 tokens back: 50 needs 2.5 s more -> 3 s
    assert refused(lim, "a", limits, 50).retry_after_s == 3
    lim.give_back("a", 300)  # a request that used less than it counted
    lim.take("a", limits, 300)
    lim.give_back("a", 10_000)  # never past the minute's worth
    lim.take("a", limits, 600)
    refused(lim, "a", limits, 1)
    lim.give_back("nobody", 10)  # unknown keys: nothing to do


def test_a_request_larger_than_the_budget_passes_on_a_full_bucket_and_leaves_a_debt():
    clock = Clock()
    lim = KeyRateLimiter(clock)
    limits = KeyLimits(tokens_per_min=60)  # 1 token/s
    lim.take("a", limits, 10)
    e = refused(lim, "a", limits, 120)  # needs a full bucket: 10 s
    assert e.wait_s == pytest.approx(10.0)
    clock.t += 10
    lim.take("a", limits, 120)  # level 60 - 120 = -60
    e = refused(lim, "a", limits, 1)
    assert e.wait_s == pytest.approx(61.0) and e.retry_after_s == 61


def test_a_refused_request_counts_nothing_and_the_longer_wait_is_named():
    clock = Clock()
    lim = KeyRateLimiter(clock)
    limits = KeyLimits(requests_per_s=1, burst=2, tokens_per_min=60)
    lim.take("a", limits, 50)
    e = refused(lim, "a", limits, 30)  # requests has room, tokens not: nothing taken from requests
    assert e.limit == "tokens" and e.wait_s == pytest.approx(20.0)
    lim.take("a", limits, 10)  # the second request of the burst is still there
    e = refused(lim, "a", limits, 0)
    assert e.limit == "requests" and e.wait_s == pytest.approx(1.0)
    e = refused(lim, "a", limits, 30)  # both short: the longer wait (tokens, 30 s) is reported
    assert e.limit == "tokens" and e.retry_after_s == 30


def test_keys_have_their_own_buckets_and_new_limits_keep_the_level():
    clock = Clock()
    lim = KeyRateLimiter(clock)
    one = KeyLimits(requests_per_s=1)
    lim.take("noisy", one)
    refused(lim, "noisy", one)
    lim.take("quiet", one)  # untouched by the noisy key
    more = KeyLimits(requests_per_s=1, burst=3)  # the keys file changed: a larger bucket, still empty
    refused(lim, "noisy", more)
    clock.t += 3  # refills at the rate up to the new burst
    for _ in range(3):
        lim.take("noisy", more)
    refused(lim, "noisy", more)


def test_a_share_scales_rate_and_burst():
    clock = Clock()
    lim = KeyRateLimiter(clock)
    limits = KeyLimits(requests_per_s=10, burst=10, tokens_per_min=600)
    half = (0.5, 0.5)
    for _ in range(5):
        lim.take("k", limits, 0, half)
    with pytest.raises(RateLimited):
        lim.take("k", limits, 0, half)
    clock.t += 0.2  # 5 requests/s: one more
    lim.take("k", limits, 0, half)
    with pytest.raises(RateLimited) as e:
        lim.take("k", limits, 400, half)  # 300 tokens a half share's whole minute: needs a full bucket
    assert e.value.limit in ("requests", "tokens")


def test_a_larger_share_gives_no_fresh_burst():
    clock = Clock()
    lim = KeyRateLimiter(clock)
    limits = KeyLimits(requests_per_s=10, burst=10)
    for _ in range(5):
        lim.take("k", limits, 0, (0.5, 1.0))
    with pytest.raises(RateLimited):
        lim.take("k", limits, 0, (1.0, 1.0))  # the bucket grew, its level did not
    clock.t += 0.1  # refills at the full rate now
    lim.take("k", limits, 0, (1.0, 1.0))
    clock.t += 5  # full again (10)
    for _ in range(2):  # a smaller share clips the level to its burst (2)
        lim.take("k", limits, 0, (0.2, 1.0))
    with pytest.raises(RateLimited):
        lim.take("k", limits, 0, (0.2, 1.0))
