"""The preemption rule (pure): priority victims, fair-share victims, the gain rule and the cap; and
late binding's use of it (``preempt_room``)."""

from __future__ import annotations

import pytest
from llmfleet.policies.capacity.preempt_room import may_preempt
from llmfleet.policies.request.preemption import Claim, PreemptionRule, fair_shares, under_hold_queue

RULE = PreemptionRule()


def c(key: str, priority: int = 0, tenant: str = "", arrival: float = 0.0, preemptions: int = 0) -> Claim:
    return Claim(key, priority, tenant, arrival, preemptions)


def test_fair_shares_water_fill() -> None:
    assert fair_shares(4, {"light": 1, "heavy": 9}) == {"light": 1.0, "heavy": 3.0}
    assert fair_shares(4, {"a": 5, "b": 5}) == {"a": 2.0, "b": 2.0}
    assert fair_shares(3, {"a": 1, "b": 1}) == {"a": 1.0, "b": 1.0}
    assert fair_shares(0, {"a": 1}) == {"a": 0.0}


def test_priority_preempts_the_lowest_then_latest() -> None:
    holders = [c("a", 0, arrival=1), c("b", 0, arrival=3), c("d", -1, arrival=0), c("e", -1, arrival=2)]
    assert RULE.victim(c("x", 1), holders, 4) == holders[3]  # lowest priority, latest arrival of them
    assert RULE.victim(c("x", 0), holders, 4) == holders[3]  # above -1 too
    assert RULE.victim(c("x", -1), holders, 4) is None  # equal priorities never preempt one another


def test_priority_never_preempts_when_its_band_fills_the_slots() -> None:
    holders = [c("h1", 1), c("h2", 1), c("l", 0)]
    assert RULE.victim(c("x", 1), holders, 3) == holders[2]
    assert RULE.victim(c("x", 1), holders, 2) is None  # (the scheduler's view: priority 1 fills 2 slots)


def test_cap_bounds_how_often_a_request_is_preempted() -> None:
    worn = c("l", 0, preemptions=RULE.max_preemptions)
    assert RULE.victim(c("x", 1), [worn], 1) is None
    assert PreemptionRule(max_preemptions=3).victim(c("x", 1), [worn], 1) == worn
    with pytest.raises(ValueError):
        PreemptionRule(max_preemptions=-1)


def test_a_tenant_under_its_share_preempts_the_tenant_furthest_above() -> None:
    heavy = [c(f"h{i}", tenant="heavy", arrival=i) for i in range(3)]
    holders = [*heavy, c("m", tenant="mid", arrival=9)]
    got = RULE.victim(c("x", tenant="light", arrival=10), holders, 4)
    assert got == heavy[-1]  # heavy holds 3 (share 4/3), mid 1: heavy's latest


def test_fairness_only_when_it_narrows_the_gap() -> None:
    holders = [c("a1", tenant="a"), c("a2", tenant="a"), c("b1", tenant="b")]
    # b holds 1 of 3 slots, a 2 with b waiting too: shares 1.5 / 1.5; b + 1 = 2 > a - 1 = 1: no ping-pong
    assert RULE.victim(c("b2", tenant="b"), holders, 3) is None
    # with 4 slots and a holding 3: b (1) + 1 <= a (3) - 1
    holders4 = [*holders, c("a3", tenant="a", arrival=5)]
    assert RULE.victim(c("b2", tenant="b"), holders4, 4) == holders4[-1]


def test_fairness_needs_a_tenant_and_stays_in_its_band() -> None:
    heavy = [c(f"h{i}", tenant="heavy") for i in range(4)]
    assert RULE.victim(c("x", tenant=""), heavy, 4) is None
    assert PreemptionRule(fairness=False).victim(c("x", tenant="light"), heavy, 4) is None
    high = [c(f"h{i}", 1, tenant="heavy") for i in range(4)]
    assert RULE.victim(c("x", 0, tenant="light"), high, 4) is None  # a higher band is never touched


def test_waiting_requests_count_as_their_tenants_demand() -> None:
    holders = [c("a1", tenant="a"), c("a2", tenant="a"), c("a3", tenant="a"), c("b1", tenant="b")]
    # a's waiting requests raise its demand, not its share past 2 of 4 slots
    waiting = [c("b2", tenant="b"), c("a4", tenant="a")]
    assert RULE.victim(waiting[0], holders, 4, waiting) == holders[2]


def test_may_preempt_is_self_limiting() -> None:
    heavy = [c(f"h{i}", tenant="heavy", arrival=i) for i in range(4)]
    assert may_preempt(c("l1", tenant="light"), heavy, 4, RULE)
    sent = [*heavy, c("l1", tenant="light")]  # counted once sent, though it waits there
    assert may_preempt(c("l2", tenant="light"), sent, 4, RULE)
    sent2 = [*sent, c("l2", tenant="light")]
    assert not may_preempt(c("l3", tenant="light"), sent2, 4, RULE)  # light holds its share (2)
    assert not may_preempt(c("l1", tenant="light"), heavy, 4, None)
    lows = [c(f"l{i}", 0) for i in range(4)]
    highs = [c(f"h{i}", 1) for i in range(4)]
    assert may_preempt(c("h", 1), lows, 4, RULE)
    assert not may_preempt(c("h", 1), [*lows, *highs], 4, RULE)  # priority 1 fills the batch already


def test_first_preempting_asks_once_per_kind_in_queue_order() -> None:
    from llmfleet.policies.capacity.preempt_room import first_preempting

    held = [
        c("h1", tenant="heavy"),
        c("h2", tenant="heavy"),
        c("l1", tenant="light"),
        c("l2", tenant="light"),
    ]
    asked: list[str] = []

    def may(x: Claim) -> bool:
        asked.append(x.key)
        return x.tenant == "light"

    assert first_preempting(held, may, lambda x: (x.priority, x.tenant)) == held[2]
    assert asked == ["h1", "l1"]  # the oldest of each kind
    assert first_preempting(held[:2], may, lambda x: (x.priority, x.tenant)) is None


def test_credit_lets_a_light_key_burst_past_its_share() -> None:
    heavy = [c(f"h{i}", tenant="heavy", arrival=i) for i in range(2)]
    holders = [*heavy, c("l1", tenant="light"), c("l2", tenant="light")]
    burst = c("l3", tenant="light", arrival=9)
    assert RULE.victim(burst, holders, 4) is None  # light holds its share, 2 of 4
    credit = {"light": 0.8, "heavy": -0.5}  # light held less than its share lately, heavy more
    assert RULE.victim(burst, holders, 4, credit=credit) == heavy[-1]
    after = [heavy[0], *holders[2:], burst]  # light 3, heavy 1: heavy may not take it back
    assert RULE.victim(c("h9", tenant="heavy", arrival=10), after, 4, credit=credit) is None
    # with heavy asking for more, a fourth light request finds light above its share plus credit
    more = [c("l4", tenant="light", arrival=11), c("h9", tenant="heavy", arrival=10)]
    assert RULE.victim(more[0], after, 4, more, credit=credit) is None


def test_credit_needs_a_gap_wider_than_a_swap() -> None:
    holders = [
        c("h1", tenant="heavy"),
        c("h2", tenant="heavy"),
        c("l1", tenant="light"),
        c("l2", tenant="light"),
    ]
    # credits one slot apart: the move would only swap the two keys' excesses
    assert RULE.victim(c("l3", tenant="light"), holders, 4, credit={"light": 0.5, "heavy": -0.5}) is None
    assert RULE.victim(c("l3", tenant="light"), holders, 4, credit={"light": 0.6, "heavy": -0.5}) is not None


def test_zero_credit_is_the_instantaneous_rule() -> None:
    holders = [c("a1", tenant="a"), c("a2", tenant="a"), c("b1", tenant="b"), c("a3", tenant="a", arrival=5)]
    for slots in (3, 4, 5):
        for credit in (None, {}, {"a": 0.0, "b": 0.0}):
            assert RULE.victim(c("b2", tenant="b"), holders, slots, credit=credit) == RULE.victim(
                c("b2", tenant="b"), holders, slots
            )
    with pytest.raises(ValueError):
        PreemptionRule(credit_window_s=-1)


def test_a_gap_of_one_slot_under_fractional_shares_is_a_swap() -> None:
    # three tenants on 4 slots (shares 4/3): b holds 1, a 2: the gap is exactly one slot, a swap
    holders = [c("a1", tenant="a"), c("a2", tenant="a"), c("b1", tenant="b"), c("d1", tenant="d")]
    waiting = [c("b2", tenant="b"), c("a3", tenant="a"), c("d2", tenant="d")]
    assert RULE.victim(waiting[0], holders, 4, waiting) is None


def test_late_binding_keeps_fairness_only_under_a_fair_hold_queue() -> None:
    rule = PreemptionRule(max_preemptions=3, credit_window_s=4.0)
    assert under_hold_queue(rule, True) is rule
    assert under_hold_queue(rule, False) == PreemptionRule(
        fairness=False, max_preemptions=3, credit_window_s=4.0
    )
    assert under_hold_queue(None, False) is None
    priority_only = PreemptionRule(fairness=False)
    assert under_hold_queue(priority_only, False) is priority_only
