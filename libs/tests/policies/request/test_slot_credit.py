"""The fairness credit (pure): entitled shares by band among the active tenants, the time average, a
tenant's window of activity, and the rule's tracker."""

from __future__ import annotations

import math

import pytest
from llmfleet.policies.request.preemption import Claim, PreemptionRule
from llmfleet.policies.request.slot_credit import (
    EngineCredits,
    SlotCredit,
    credit_for,
    entitled_gaps,
    held_pairs,
)


def c(key: str, priority: int = 0, tenant: str = "") -> Claim:
    return Claim(key, priority, tenant)


def test_entitled_gaps_split_each_band_evenly_among_the_active_tenants() -> None:
    holders = [c("h1", 1, "vip"), c("a1", 0, "a"), c("a2", 0, "a"), c("a3", 0, "a"), c("n", 0, "")]
    active = [(1, "vip"), (0, "a"), (0, "b"), (0, "")]  # b holds nothing now; "" is no tenant
    gaps = entitled_gaps(held_pairs(holders), active, 5)
    assert gaps == {(1, "vip"): 4.0, (0, "a"): 2.0 - 3.0, (0, "b"): 2.0}  # band 0 has 5 - 1 = 4 slots
    assert entitled_gaps(held_pairs(holders), [], 4) == {}


def test_until_a_request_is_seen_to_start_credit_is_the_bank_over_the_window() -> None:
    credit = SlotCredit(10.0)
    light, heavy = [c("l1", 0, "light")], [c(f"h{i}", 0, "heavy") for i in range(3)]
    credit.observe(0.0, held_pairs([*light, *heavy]), (), 4, 0)  # light entitled 2, holds 1: +1; heavy -1
    assert credit.of(0) == {} and credit.hold_s == 10.0
    credit.observe(10.0, held_pairs([*light, *heavy]), (), 4, 0)
    bank = 10.0 * (1 - math.exp(-1.0))  # 10 s of a 1-slot gap, leaking with the 10 s window
    assert credit.banks == pytest.approx({(0, "light"): bank, (0, "heavy"): -bank})
    assert credit.of(0) == pytest.approx({"light": bank / 10.0, "heavy": -bank / 10.0})
    assert credit.of(1) == {}


def test_credit_counts_the_bank_in_requests_of_the_measured_duration() -> None:
    credit = SlotCredit(10.0)
    heavy = [c(f"h{i}", 0, "heavy") for i in range(4)]
    credit.observe(0.0, held_pairs(heavy), [(0, "light")], 4, 0)  # light asks: entitled 2, holds 0
    for t in range(1, 11):  # the heavy key's 4 slots turn over every 0.5 s: 8 starts a second
        credit.observe(float(t), held_pairs(heavy), (), 4, 8)
    assert credit.hold_s == pytest.approx(0.5, rel=0.06)  # Little's law: 4 slots held / 8 starts a second
    bank = 2 * 10.0 * (1 - math.exp(-1.0))
    assert credit.banks[(0, "light")] == pytest.approx(bank)
    assert credit.of(0)["light"] == pytest.approx(bank / credit.hold_s)  # about 25 requests' worth
    assert credit.of(0)["heavy"] == pytest.approx(-bank / credit.hold_s)


def test_a_newcomer_starts_at_zero_and_earns_at_its_unused_share() -> None:
    credit = SlotCredit(10.0)
    heavy = [c(f"h{i}", 0, "heavy") for i in range(4)]
    credit.observe(0.0, held_pairs(heavy), (), 4, 0)
    credit.observe(1.0, held_pairs(heavy), (), 4, 8)  # requests hold slots for about 0.5 s
    credit.observe(1.0, held_pairs(heavy), [(0, "light")], 4, 0)  # light arrives: nothing banked yet
    assert "light" not in credit.of(0)
    credit.observe(1.25, held_pairs(heavy), [(0, "light")], 4, 2)  # a quarter second of its entitled 2
    assert credit.of(0)["light"] == pytest.approx(2 * 10.0 * (1 - math.exp(-0.025)) / credit.hold_s)
    assert 0.9 < credit.of(0)["light"] < 1.1  # one request's worth after half a request's duration


def test_an_idle_tenant_stays_entitled_for_a_window_then_leaves() -> None:
    credit = SlotCredit(5.0)
    heavy = [c(f"h{i}", 0, "heavy") for i in range(4)]
    credit.observe(0.0, held_pairs([c("l", 0, "light"), *heavy[:3]]), (), 4, 0)
    credit.observe(
        1.0, held_pairs(heavy), (), 4, 1
    )  # light's request ended: it is still active, entitled 2, holds 0
    earned = credit.of(0)["light"]
    credit.observe(5.0, held_pairs(heavy), (), 4, 0)
    assert credit.of(0)["light"] > earned > 0  # it earns while idle within the window
    assert credit.of(0)["heavy"] < -earned  # heavy holds light's entitled slots meanwhile
    credit.observe(
        6.5, held_pairs(heavy), (), 4, 0
    )  # light last asked 6.5 s ago: gone, and heavy alone is entitled 4
    assert "light" not in credit.of(0)
    owed = credit.of(0)["heavy"]
    credit.observe(60.0, held_pairs(heavy), (), 4, 0)
    assert owed < 0 and "heavy" not in credit.of(0) and len(credit) == 0  # its debt decays to nothing


def test_observations_out_of_order_change_nothing() -> None:
    credit = SlotCredit(1.0)
    credit.observe(5.0, held_pairs([c("a", 0, "a")]), held_pairs([c("b", 0, "b")]), 2, 0)
    credit.observe(4.0, held_pairs([]), (), 2, 0)
    credit.observe(6.0, held_pairs([]), (), 2, 0)
    assert credit.banks[(0, "b")] == pytest.approx(1 - math.exp(-1.0))  # a held its entitled 1: no bank
    assert credit.of(0) == pytest.approx({"b": 1.0})  # a request held its slot as long as b banked


def test_credit_for_follows_the_rule() -> None:
    assert credit_for(None) is None
    assert credit_for(PreemptionRule(fairness=False)) is None
    assert credit_for(PreemptionRule(credit_window_s=0)) is None
    got = credit_for(PreemptionRule(credit_window_s=3.0))
    assert got is not None and got.window_s == 3.0
    with pytest.raises(ValueError):
        SlotCredit(0.0)


def test_engine_credits_keep_one_tracker_per_engine_until_it_leaves() -> None:
    credits, rule = EngineCredits(), PreemptionRule(credit_window_s=10.0)
    light, heavy = [c("l1", 0, "light")], [c(f"h{i}", 0, "heavy") for i in range(3)]
    assert credits.band("e0", rule, 0.0, [*light, *heavy], 4, 0) == {}
    assert credits.band("e1", rule, 0.0, heavy, 4, 0) == {}
    got = credits.band("e0", rule, 10.0, [*light, *heavy], 4, 0)
    assert got == pytest.approx({"light": 1 - math.exp(-1.0), "heavy": -(1 - math.exp(-1.0))})
    # e1 has its own tracker: heavy alone holds 3 of its entitled 4 there
    assert credits.band("e1", rule, 10.0, heavy, 4, 0) == pytest.approx({"heavy": 1 - math.exp(-1.0)})
    # claims not present at the last weighing took their slots since: e0's requests hold them ~2.5 s
    turned = [c(f"n{i}", 0, "heavy") for i in range(3)]
    credits.band("e0", rule, 12.0, [*light, *turned], 4, 0)
    credits.band("e0", rule, 12.0, [*light, *turned], 4, 0)  # the same claims again: no new start
    assert credits.band("e0", rule, 12.0, [*light, *turned], 4, 0)["light"] > got["light"]
    credits.forget("e0")
    assert credits.band("e0", rule, 20.0, [*light, *heavy], 4, 0) == {}  # a new tracker
    assert credits.band("e2", PreemptionRule(credit_window_s=0), 30.0, heavy, 4, 0) is None  # no credit
