"""The fair hold queue (virtual token counter within priority bands), the priority rules, and the
order both hold queues agree on."""

from __future__ import annotations

import pytest
from llmfleet.policies.capacity import FairQueue, HoldQueue, make_hold_queue, weighted_tokens
from llmfleet.policies.capacity.priority import MAX_PRIORITY, request_priority, sheddable


def drain(q: FairQueue[str] | HoldQueue[str]) -> list[str]:
    out = []
    while (x := q.pop()) is not None:
        out.append(x)
    return out


def test_the_smallest_counter_is_served_first_then_the_lighter_backlog_then_arrival():
    q: FairQueue[str] = FairQueue()
    for i in range(3):
        q.push(f"a{i}", f"a{i}", arrival=i, tenant="a", cost=100)
    for i in range(3):
        q.push(f"b{i}", f"b{i}", arrival=10 + i, tenant="b", cost=10)
    # a tie at 0: b holds fewer tokens; then a0 (a at 0 < b at 10); a's 100 puts b's others first
    assert drain(q) == ["b0", "a0", "b1", "b2", "a1", "a2"]
    assert q.counter("a") == 300 and q.counter("b") == 30


def test_a_heavy_tenant_does_not_starve_a_light_one():
    q: FairQueue[str] = FairQueue()
    for i in range(100):
        q.push(f"h{i}", f"h{i}", arrival=i, tenant="heavy", cost=10)
    q.push("l0", "l0", arrival=50, tenant="light", cost=10)  # arrives behind 100 of heavy's
    order = drain(q)
    assert order.index("l0") <= 1  # lifted to heavy's counter, not behind its backlog


def test_a_tenant_that_becomes_backlogged_is_lifted_to_the_least_backlogged_counter():
    q: FairQueue[str] = FairQueue()
    q.push("b0", "b0", arrival=0, tenant="b", cost=5)
    q.pop()  # b served 5, now idle
    for i in range(4):
        q.push(f"a{i}", f"a{i}", arrival=1 + i, tenant="a", cost=10)
    q.pop()
    q.pop()  # a served 20, still backlogged
    assert q.counter("a") == 20
    q.push("b1", "b1", arrival=9, tenant="b", cost=10)  # b was idle: it banks no credit
    assert q.counter("b") == 20
    assert drain(q) == ["b1", "a2", "a3"]  # a tie: b holds fewer tokens (10 against a's 20)


def test_an_idle_tenant_keeps_a_larger_counter():
    q: FairQueue[str] = FairQueue()
    q.push("a0", "a0", arrival=0, tenant="a", cost=50)
    q.pop()
    q.push("b0", "b0", arrival=1, tenant="b", cost=1)
    q.push("a1", "a1", arrival=2, tenant="a", cost=1)  # lifted to max(50, b's 0) = 50
    assert drain(q) == ["b0", "a1"]


def test_priority_bands_come_before_fairness():
    q: FairQueue[str] = FairQueue()
    q.push("low", "low", arrival=0, priority=-1, tenant="a")
    q.push("mid", "mid", arrival=1, priority=0, tenant="a", cost=1000)
    q.push("mid2", "mid2", arrival=2, priority=0, tenant="a")
    q.push("high", "high", arrival=3, priority=5, tenant="b")
    assert drain(q) == ["high", "mid", "mid2", "low"]


def test_charge_corrects_the_counter_and_removal_is_uncharged():
    q: FairQueue[str] = FairQueue()
    q.push("a0", "a0", arrival=0, tenant="a", cost=weighted_tokens(10, 100))
    q.push("a1", "a1", arrival=1, tenant="a", cost=7)
    assert q.remove("a1") == "a1" and "a1" not in q
    q.pop()
    assert q.counter("a") == 210
    q.charge("a", weighted_tokens(0, 20 - 100))  # generated 20 of 100
    assert q.counter("a") == 50
    assert len(q) == 0 and q.pop() is None


def test_expired_and_last_behind():
    q: FairQueue[str] = FairQueue()
    q.push("x", "x", arrival=0, priority=-1, deadline=5, tenant="a")
    q.push("y", "y", arrival=1, priority=-1, tenant="b", cost=50)
    q.push("z", "z", arrival=2, priority=0, tenant="b", cost=30)
    q.charge("b", 100)
    assert q.expired(4) == [] and q.expired(5) == ["x"]
    assert q.last_behind(0, "a", lambda _: True) == "y"  # the lower band
    # same band: c is lifted to b's 100, and y goes only once b's z (30) is served: at 130
    assert q.last_behind(-1, "c", lambda _: True) == "y"
    assert q.last_behind(-1, "b", lambda _: True) is None  # b's own: it goes behind them
    assert q.last_behind(-2, "a", lambda _: True) is None
    assert q.last_behind(1, "a", lambda item: item != "y") == "z"
    assert q.items() == ["z", "y"]


@pytest.mark.parametrize("fairness", ["vtc", "none"])
def test_both_queues_order_one_tenant_by_priority_then_arrival(fairness):
    q = make_hold_queue(fairness)
    for i, p in enumerate([0, 2, 0, -1, 2]):
        q.push(f"r{i}", f"r{i}", arrival=i, priority=p)
    assert q.peek() == "r1"
    assert drain(q) == ["r1", "r4", "r0", "r2", "r3"]


def test_hold_queue_last_behind_is_the_lowest_latest():
    q: HoldQueue[str] = HoldQueue()
    for i, p in enumerate([0, -2, -2, 1]):
        q.push(f"r{i}", f"r{i}", arrival=i, priority=p)
    assert q.last_behind(0, "", lambda _: True) == "r2"
    assert q.last_behind(-2, "", lambda _: True) is None


def test_unknown_fairness_is_refused():
    with pytest.raises(ValueError, match="fairness must be one of"):
        make_hold_queue("round_robin")  # type: ignore[arg-type]


def test_request_priority():
    assert request_priority(None, 3, 0) == 3  # the service's
    assert request_priority(-5, 0, 0) == -5 and sheddable(-5) and not sheddable(0)
    assert request_priority(3, 3, 0) == 3  # a key may always ask for its service's own
    assert request_priority(MAX_PRIORITY, 0, None) == MAX_PRIORITY  # no key: the range only
    with pytest.raises(ValueError, match="above what the API key allows"):
        request_priority(1, 0, 0)
    with pytest.raises(ValueError, match=r"must be an integer in \[-10, 10\]"):
        request_priority(11, 0, None)
