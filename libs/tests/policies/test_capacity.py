"""The pure capacity policies: when an engine has room (late binding), the cold-start
timeout, a model too large for every engine, the hold queue's order, and queues counted as demand."""

from __future__ import annotations

import pytest
from llmfleet.policies.capacity import HoldQueue, Saturation, cold_start_timeout_s, unplaceable
from llmfleet.policies.capacity.cold_start import EngineSize
from llmfleet.policies.dispatch import EngineCandidate
from llmfleet.policies.placement import ServiceLoad
from llmfleet.policies.placement.backlog import with_backlog

GIB = 1 << 30


def cand(running=0, waiting=0, max_running=0, kv_used=0, kv_cap=0, kv_waiting=0) -> EngineCandidate:
    return EngineCandidate(
        "e", ("m",), running, waiting, kv_used, kv_cap, kv_waiting_bytes=kv_waiting, max_running=max_running
    )


def test_room_is_the_batch_plus_a_slack_when_the_engine_reports_its_batch() -> None:
    s = Saturation(queue_slack=2)
    assert s.has_room(cand(running=8, waiting=1, max_running=8))
    assert not s.has_room(cand(running=8, waiting=2, max_running=8))
    assert s.has_room(cand(running=3, waiting=0, max_running=8))


def test_without_a_batch_size_only_the_engine_queue_counts() -> None:
    s = Saturation(queue_slack=2)
    assert s.has_room(cand(running=0, waiting=1))
    assert not s.has_room(cand(running=0, waiting=2))
    # at least one may always be queued, whatever runs
    assert Saturation(queue_slack=0).has_room(cand(running=5))
    assert not Saturation(queue_slack=0).has_room(cand(running=5, waiting=1))


def test_slack_zero_holds_every_request_past_the_batch() -> None:
    s = Saturation(queue_slack=0)
    assert s.has_room(cand(running=7, max_running=8))
    assert not s.has_room(cand(running=8, max_running=8))


def test_a_nearly_full_kv_pool_has_no_room_counting_queued_prompts() -> None:
    s = Saturation(queue_slack=100, kv_fraction=0.9)
    assert s.has_room(cand(kv_used=80, kv_cap=100))
    assert not s.has_room(cand(kv_used=80, kv_waiting=10, kv_cap=100))
    assert s.with_room([cand(kv_used=95, kv_cap=100), cand(kv_used=10, kv_cap=100)]) == [
        cand(kv_used=10, kv_cap=100)
    ]


@pytest.mark.parametrize("bad", [{"queue_slack": -1}, {"kv_fraction": 0.0}, {"kv_fraction": 1.5}])
def test_bad_saturation_settings_are_refused(bad) -> None:
    with pytest.raises(ValueError):
        Saturation(**bad)


def test_cold_start_timeout_is_ten_ttfts_capped_at_two_minutes() -> None:
    assert cold_start_timeout_s(0.0, 2.0) == 20.0
    assert cold_start_timeout_s(0.0, 30.0) == 120.0
    assert cold_start_timeout_s(0.0, None) == 120.0
    assert cold_start_timeout_s(7.5, 2.0) == 7.5  # the service's own setting wins


def test_a_model_larger_than_every_engine_is_unplaceable_naming_the_largest() -> None:
    engines = [EngineSize("a", 24 * GIB), EngineSize("b", 80 * GIB), EngineSize("c", 0)]
    why = unplaceable("llama2-70b", 130 * GIB, engines)
    assert why is not None and "llama2-70b" in why and "largest engine, b, has 80.0 GiB" in why
    assert unplaceable("llama2-7b", 13 * GIB, engines) is None
    assert unplaceable("odd", 0, engines) is None  # unknown weights: placement decides
    assert unplaceable("m", 130 * GIB, [EngineSize("x", 0)]) is None  # unknown sizes


def test_hold_queue_orders_by_priority_then_arrival_and_removes_in_place() -> None:
    q: HoldQueue[str] = HoldQueue()
    q.push("a", "a", arrival=1.0)
    q.push("b", "b", arrival=0.5)
    q.push("c", "c", arrival=2.0, priority=1)
    q.push("d", "d", arrival=3.0, deadline=10.0)
    assert len(q) == 4 and "b" in q
    assert q.items() == ["c", "b", "a", "d"]
    assert q.remove("b") == "b" and q.remove("b") is None
    assert q.pop() == "c" and q.peek() == "a"
    assert q.expired(9.9) == [] and q.expired(10.0) == ["d"]
    q.set_deadline("a", 5.0)
    assert q.expired(6.0) == ["a"] and len(q) == 0 and q.pop() is None
    q.push("a", "again", arrival=0.0)  # a removed key can come back
    with pytest.raises(KeyError):
        q.push("a", "twice", arrival=0.0)


def test_queued_requests_count_as_demand_served_within_the_interval() -> None:
    loads = [ServiceLoad("s", "m", rate_rps=2.0, queued=100), ServiceLoad("t", "m", rate_rps=1.0)]
    out = with_backlog(loads, drain_s=5.0)
    assert out[0].rate_rps == pytest.approx(22.0) and out[1] is loads[1]
    with pytest.raises(ValueError):
        with_backlog(loads, 0.0)


def test_queue_moves_take_the_newest_excess_to_the_engine_with_most_room() -> None:
    from llmfleet.policies.capacity import plan_queue_moves

    s = Saturation(queue_slack=1)
    full = EngineCandidate("a", ("m",), running=4, waiting=3, max_running=4)  # room 5: 2 past it
    some = EngineCandidate("b", ("m",), running=4, waiting=0, max_running=4)  # room for 1
    idle = EngineCandidate("c", ("m",), max_running=4)  # room for 5
    other = EngineCandidate("d", ("x",), max_running=4)  # another model: never a destination
    queued = {"a": [("r1", "m"), ("r2", "m"), ("r3", "m")]}
    moves = plan_queue_moves([full, some, idle, other], queued, s)
    assert moves == [("r3", "a", "c"), ("r2", "a", "c")]  # the newest first, to the roomiest
    assert plan_queue_moves([full, other], queued, s) == []  # nowhere with room for model m
    assert plan_queue_moves([some, idle], {"b": [("r", "m")]}, s) == []  # nobody past its room
