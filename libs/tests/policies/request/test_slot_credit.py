"""The fairness credit (pure): entitled shares by band, the time average, frozen while a tenant asks
for nothing, and the rule's tracker."""

from __future__ import annotations

import math

import pytest
from llmfleet.policies.request.preemption import Claim, PreemptionRule
from llmfleet.policies.request.slot_credit import SlotCredit, credit_for, entitled_gaps


def c(key: str, priority: int = 0, tenant: str = "") -> Claim:
    return Claim(key, priority, tenant)


def test_entitled_gaps_split_each_band_evenly_among_the_tenants_asking() -> None:
    holders = [c("h1", 1, "vip"), c("a1", 0, "a"), c("a2", 0, "a"), c("a3", 0, "a"), c("n", 0, "")]
    waiting = [c("b1", 0, "b")]
    gaps = entitled_gaps(holders, waiting, 5)
    assert gaps == {(1, "vip"): 4.0, (0, "a"): 0.0 - 1.0, (0, "b"): 2.0}  # band 0 has 5 - 1 = 4 slots
    assert entitled_gaps([], [], 4) == {}


def test_credit_is_a_time_average_of_the_gap() -> None:
    credit = SlotCredit(10.0)
    light, heavy = [c("l1", 0, "light")], [c(f"h{i}", 0, "heavy") for i in range(3)]
    credit.observe(0.0, [*light, *heavy], [], 4)  # light entitled 2, holds 1: +1; heavy -1
    assert credit.of(0) == {}
    credit.observe(10.0, [*light, *heavy], [], 4)
    w = 1 - math.exp(-1.0)
    assert credit.of(0) == pytest.approx({"light": w, "heavy": -w})
    assert credit.of(1) == {}


def test_a_tenant_asking_for_nothing_keeps_its_credit() -> None:
    credit = SlotCredit(5.0)
    heavy = [c(f"h{i}", 0, "heavy") for i in range(4)]
    credit.observe(0.0, [c("l", 0, "light"), *heavy[:3]], [], 4)
    credit.observe(5.0, heavy, [], 4)  # light leaves; heavy alone is entitled to all 4 slots
    banked = credit.of(0)["light"]
    credit.observe(100.0, heavy, [], 4)
    assert credit.of(0)["light"] == banked  # frozen while light asks for nothing
    assert "heavy" not in credit.of(0)  # heavy's debt decays while it holds its whole entitlement
    assert len(credit) == 1


def test_observations_out_of_order_change_nothing() -> None:
    credit = SlotCredit(1.0)
    credit.observe(5.0, [c("a", 0, "a")], [c("b", 0, "b")], 2)
    credit.observe(4.0, [], [], 2)
    credit.observe(6.0, [], [], 2)
    assert credit.of(0) == pytest.approx({"b": 1 - math.exp(-1.0)})  # a held its entitled 1: no credit


def test_credit_for_follows_the_rule() -> None:
    assert credit_for(None) is None
    assert credit_for(PreemptionRule(fairness=False)) is None
    assert credit_for(PreemptionRule(credit_window_s=0)) is None
    got = credit_for(PreemptionRule(credit_window_s=3.0))
    assert got is not None and got.window_s == 3.0
    with pytest.raises(ValueError):
        SlotCredit(0.0)
