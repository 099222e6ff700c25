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


def test_credit_is_a_time_average_of_the_gap() -> None:
    credit = SlotCredit(10.0)
    light, heavy = [c("l1", 0, "light")], [c(f"h{i}", 0, "heavy") for i in range(3)]
    credit.observe(0.0, held_pairs([*light, *heavy]), (), 4)  # light entitled 2, holds 1: +1; heavy -1
    assert credit.of(0) == {}
    credit.observe(10.0, held_pairs([*light, *heavy]), (), 4)
    w = 1 - math.exp(-1.0)
    assert credit.of(0) == pytest.approx({"light": w, "heavy": -w})
    assert credit.of(1) == {}


def test_an_idle_tenant_stays_entitled_for_a_window_then_leaves() -> None:
    credit = SlotCredit(5.0)
    heavy = [c(f"h{i}", 0, "heavy") for i in range(4)]
    credit.observe(0.0, held_pairs([c("l", 0, "light"), *heavy[:3]]), (), 4)
    credit.observe(
        1.0, held_pairs(heavy), (), 4
    )  # light's request ended: it is still active, entitled 2, holds 0
    earned = credit.of(0)["light"]
    credit.observe(5.0, held_pairs(heavy), (), 4)
    assert credit.of(0)["light"] > earned > 0  # it earns while idle within the window
    assert credit.of(0)["heavy"] < -earned  # heavy holds light's entitled slots meanwhile
    credit.observe(
        6.5, held_pairs(heavy), (), 4
    )  # light last asked 6.5 s ago: gone, and heavy alone is entitled 4
    assert "light" not in credit.of(0)
    owed = credit.of(0)["heavy"]
    credit.observe(60.0, held_pairs(heavy), (), 4)
    assert owed < 0 and "heavy" not in credit.of(0) and len(credit) == 0  # its debt decays to nothing


def test_observations_out_of_order_change_nothing() -> None:
    credit = SlotCredit(1.0)
    credit.observe(5.0, held_pairs([c("a", 0, "a")]), held_pairs([c("b", 0, "b")]), 2)
    credit.observe(4.0, held_pairs([]), (), 2)
    credit.observe(6.0, held_pairs([]), (), 2)
    assert credit.of(0) == pytest.approx({"b": 1 - math.exp(-1.0)})  # a held its entitled 1: no credit


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
    credits.forget("e0")
    assert credits.band("e0", rule, 20.0, [*light, *heavy], 4, 0) == {}  # a new tracker
    assert credits.band("e2", PreemptionRule(credit_window_s=0), 30.0, heavy, 4, 0) is None  # no credit
