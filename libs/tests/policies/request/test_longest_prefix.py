"""Longest-prefix-first admission: the order (pure), the aging bound, and the registry's options."""

import math

import pytest
from llmfleet.policies.request import (
    Batch,
    BatchLimits,
    LongestPrefix,
    LongestPrefixOptions,
    PoolView,
    SchedRequest,
    make_request_policy,
)
from llmfleet.policies.request.longest_prefix import prefix_order

BIG = PoolView(free_blocks=10_000, watermark_blocks=0, tokens_per_block={"a": 16, "b": 16})


def w(rid, arrival, model="a", prompt=15):
    return SchedRequest(rid, model, model, arrival, prompt, 8)


def d(rid, arrival, model="a", prompt=15):
    return SchedRequest(rid, model, model, arrival, prompt, 8, generated=1, phase="decode")


def ids(reqs):
    return [r.request_id for r in reqs]


def test_order_is_most_cached_first_ties_and_unknown_in_arrival_order():
    waits = [w("a", 1.0), w("b", 2.0), w("c", 3.0), w("d", 4.0), w("e", 5.0)]
    order, head = prefix_order(waits, {"a": 0, "b": 32, "c": 64, "d": 32}, now=5.0, max_wait_s=10.0)
    assert ids(order) == ["c", "b", "d", "a", "e"]
    assert head is None  # nothing aged: no request holds back the others


def test_aged_requests_go_first_in_arrival_order_the_oldest_is_the_head():
    waits = [w("old", 0.0), w("older_cached", 0.5), w("fresh", 4.0), w("fresh_cached", 4.5)]
    cached = {"older_cached": 48, "fresh_cached": 64, "old": 0, "fresh": 0}
    order, head = prefix_order(waits, cached, now=5.0, max_wait_s=4.5)
    assert ids(order) == ["old", "older_cached", "fresh_cached", "fresh"]
    assert head is not None and head.request_id == "old"
    # max_wait_s 0: every request is aged, the order is FCFS's
    assert ids(prefix_order(waits, cached, 5.0, 0.0)[0]) == ["old", "older_cached", "fresh", "fresh_cached"]


def test_next_batch_admits_the_most_cached_requests_into_the_free_slots():
    p = LongestPrefix()
    p.on_cached({"w1": 0, "w2": 160, "w3": 16})
    waiting = [w("w1", 1.0), w("w2", 2.0), w("w3", 3.0)]
    b = p.next_batch(waiting, [d("x", 0.5)], BIG, BatchLimits(max_requests=3), now=3.0)
    assert b == Batch("a", "mixed", ("x", "w2", "w3"))


def test_without_lookups_the_order_is_fcfs():
    waiting = [w("w3", 3.0), w("w1", 1.0), w("w2", 2.0)]
    b = LongestPrefix().next_batch(waiting, [], BIG, BatchLimits(max_requests=2), now=3.0)
    assert b == Batch("a", "prefill", ("w1", "w2"))


def test_an_aged_head_that_does_not_fit_holds_later_prefills_while_something_runs():
    pool = PoolView(5, 0, {"a": 16, "b": 16})  # 80 tokens
    p = LongestPrefix(LongestPrefixOptions(max_wait_s=2.0))
    p.on_cached({"small": 16})
    waiting = [w("big", 0.0, prompt=100), w("small", 2.5)]
    running = [d("r", 0.5)]
    # big (7 blocks > 5) has aged: small, cached and fitting, must not overtake it
    assert p.next_batch(waiting, running, pool, BatchLimits(), now=3.0) == Batch("a", "decode", ("r",))
    # before big ages, small goes first (big does not fit either way)
    assert p.next_batch(waiting, running, pool, BatchLimits(), now=1.0) == Batch("a", "mixed", ("r", "small"))


def test_aging_bounds_the_wait_of_a_request_with_nothing_cached():
    """One slot per step; a cached request arrives every step and would always go first. The
    uncached one is admitted at the first step after it has waited max_wait_s."""
    p = LongestPrefix(LongestPrefixOptions(max_wait_s=1.0))
    waiting = [w("cold", 0.0)]
    admitted_at = None
    for step in range(40):
        now = 0.1 * step
        waiting.append(w(f"hot{step}", now))
        p.on_cached({r.request_id: (0 if r.request_id == "cold" else 64) for r in waiting})
        b = p.next_batch(waiting, [], BIG, BatchLimits(max_requests=1), now)
        assert b is not None
        if b.request_ids == ("cold",):
            admitted_at = now
            break
        waiting = [r for r in waiting if r.request_id not in b.request_ids]
    assert admitted_at is not None and 1.0 <= admitted_at < 1.1 + 1e-9


def test_stable_until_only_when_nothing_waits():
    p = LongestPrefix()
    decode = Batch("a", "decode", ("x",))
    assert p.stable_until(decode, [], [d("x", 0.0)], 2.0) == math.inf
    assert p.stable_until(decode, [w("y", 1.0)], [d("x", 0.0)], 2.0) == 2.0


def test_options_by_name_and_bad_values():
    p = make_request_policy("longest_prefix", lookahead=8, max_wait_s=2.5, single_phase=True, refresh=False)
    assert isinstance(p, LongestPrefix)
    assert (p.prefix_lookahead, p.max_wait_s, p.single_phase, p.prefix_refresh) == (8, 2.5, True, False)
    assert LongestPrefix().prefix_refresh
    bads = (
        {"lookahead": 0},
        {"lookahead": True},
        {"max_wait_s": -1.0},
        {"max_wait_s": math.inf},
        {"refresh": 1},
    )
    for bad in bads:
        with pytest.raises(ValueError, match="longest_prefix"):
            make_request_policy("longest_prefix", **bad)
