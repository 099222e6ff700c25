"""Admission bounds: waiting requests and queued tokens per service, released at the first token or the
end, and a retry-after from the queue's recent drain rate."""

from __future__ import annotations

import pytest
from llmfleet_scheduler.admission import Admission, Overloaded


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_waiting_bound_per_service_and_release():
    a = Admission(max_waiting=2, max_queued_tokens=10_000)
    t1, t2 = a.admit("chat", 10), a.admit("chat", 10)
    a.admit("code", 10)  # another service has its own queue
    with pytest.raises(Overloaded) as e:
        a.admit("chat", 10)
    assert "2 requests waiting, limit 2" in str(e.value) and e.value.service == "chat"
    t1.release()
    t1.release()  # idempotent: a first token and then the end release once
    assert a.waiting("chat") == (1, 10)
    a.admit("chat", 10)
    t2.release()
    assert a.waiting("chat") == (1, 10)


def test_token_bound_admits_one_oversized_request_into_an_empty_queue():
    a = Admission(max_waiting=100, max_queued_tokens=100)
    big = a.admit("chat", 500)  # alone it could never run otherwise
    with pytest.raises(Overloaded, match=r"500 \+ 1 queued tokens, limit 100"):
        a.admit("chat", 1)
    big.release()
    a.admit("chat", 60)
    with pytest.raises(Overloaded):
        a.admit("chat", 41)
    a.admit("chat", 40)


def test_service_bounds_override_the_scheduler_defaults():
    a = Admission(max_waiting=1)
    a.admit("chat", 1, max_waiting=3)
    a.admit("chat", 1, max_waiting=3)
    a.admit("chat", 1, max_waiting=3)
    with pytest.raises(Overloaded):
        a.admit("chat", 1, max_waiting=3)


def test_retry_after_follows_the_drain_rate():
    clock = Clock()
    a = Admission(max_waiting=4, window_s=10.0, clock=clock)
    tickets = [a.admit("chat", 1) for _ in range(4)]
    with pytest.raises(Overloaded) as e:
        a.admit("chat", 1)
    assert e.value.retry_after_s == 5  # nothing left the queue yet: the default
    for t in tickets:  # 4 left in the last 10 s: 0.4/s; one must leave -> 3 s
        t.release()
        clock.t += 1
    for _ in range(4):
        a.admit("chat", 1)
    with pytest.raises(Overloaded) as e:
        a.admit("chat", 1)
    assert e.value.retry_after_s == 3
    clock.t += 20  # the window forgets them
    with pytest.raises(Overloaded) as e:
        a.admit("chat", 1)
    assert e.value.retry_after_s == 5
    fast = Admission(max_waiting=1, window_s=1.0, clock=clock)
    for _ in range(50):
        fast.admit("chat", 1).release()
    fast.admit("chat", 1)
    with pytest.raises(Overloaded) as e:
        fast.admit("chat", 1)
    assert e.value.retry_after_s == 1  # clamped below at 1 s


def test_observe_reports_the_waiting_count():
    seen: list[tuple[str, int]] = []
    a = Admission(max_waiting=2, observe=lambda s, n: seen.append((s, n)))
    t = a.admit("chat", 1)
    a.admit("chat", 1)
    t.release()
    t.release()
    assert seen == [("chat", 1), ("chat", 2), ("chat", 1)]
