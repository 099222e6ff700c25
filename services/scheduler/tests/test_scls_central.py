"""SCLS central scheduling in the scheduler: the pool, the DP batches, max-min offloading, Eq. 12."""

from __future__ import annotations

import pytest
from llmfleet_scheduler.scls_central import Assignment, EngineView, SclsCentral

# a cost where a batch's serve time grows with its size and its padded length (units: seconds)
COST = {
    "prefill": {"p1": 1e-4, "p2": 1e-3, "p3": 0.0, "p4": 1e-3},
    "decode": {"d1": 1e-6, "d2": 1e-4, "d3": 0.0, "d4": 1e-3},
}


def central(engines: list[EngineView], **kw) -> SclsCentral:
    return SclsCentral(lambda model: engines if model == "m" else [], slice_iterations=8, gamma_s=0.05, **kw)


async def test_a_round_partitions_the_pool_and_offloads_longest_first_to_the_least_loaded():
    c = central([EngineView("e0", None), EngineView("e1", None)], cost=COST)
    members = [c.enqueue(f"r{i}", "svc", "m", float(i), 10 if i < 4 else 500) for i in range(6)]
    assert c.waiting() == {"m": 6}
    assert c.tick() >= 2
    got = {m.request_id: m.slot.result() for m in members}
    # the DP keeps the short prompts apart from the long ones (padding the short to 500 costs more)
    batch_of = {rid: a.batch_id for rid, a in got.items()}
    assert len({batch_of[f"r{i}"] for i in range(4)} & {batch_of["r4"], batch_of["r5"]}) == 0
    # the longest estimate went first, to e0 (both idle: first of ties); the next to the other engine
    assert got["r4"].engine_id == "e0" and got["r0"].engine_id == "e1"
    assert all(a.batch_size == sum(1 for b in got.values() if b.batch_id == a.batch_id) for a in got.values())
    assert c.waiting() == {} and c.maxmin.load("e0") > 0 and c.maxmin.load("e1") > 0


async def test_loads_drop_by_the_estimate_once_every_member_is_back():
    c = central([EngineView("e0", None)], cost=COST)
    ms = [c.enqueue(f"r{i}", "svc", "m", 0.0, 10) for i in range(3)]
    c.tick()
    a: Assignment = ms[0].slot.result()
    assert {m.slot.result().batch_id for m in ms} == {a.batch_id}
    load = c.maxmin.load("e0")
    c.returned(a)
    c.returned(a)
    assert c.maxmin.load("e0") == load  # one member still out
    c.returned(a)
    assert c.maxmin.load("e0") == 0.0


async def test_the_interval_is_eq_12():
    c = central(
        [EngineView("e0", None), EngineView("e1", None)],
        cost=COST,
    )
    c.enqueue("r0", "svc", "m", 0.0, 10)
    assert c.interval() == pytest.approx(0.05)  # both idle: Γ
    c.maxmin.loads.update({"e0": 4.0, "e1": 1.0})
    assert c.interval() == pytest.approx(0.5)  # λ · min load = 0.5 · 1.0


async def test_memory_bounds_the_batches_and_an_oversized_request_still_runs_alone():
    # 100 tokens of KV per engine: rows of (prompt + S) tokens; zeta 0.9 -> 90 usable
    c = central([EngineView("e0", 100)], cost=COST)
    small = [c.enqueue(f"s{i}", "svc", "m", 0.0, 12) for i in range(4)]  # 20 tokens a row: 4 rows fit
    huge = c.enqueue("h", "svc", "m", 0.0, 500)  # larger than the engine's pool alone
    c.tick()
    sizes = {m.slot.result().batch_size for m in small}
    assert max(sizes) * 20 <= 90
    assert huge.slot.result().batch_size == 1


async def test_no_engine_keeps_the_pool_and_withdraw_removes():
    c = central([])
    m = c.enqueue("r0", "svc", "other", 0.0, 10)
    assert c.tick() == 0 and not m.slot.done() and c.waiting() == {"other": 1}
    c.withdraw(m)
    assert c.waiting() == {}


def test_unknown_options_are_refused():
    with pytest.raises(ValueError, match="unknown keys"):
        SclsCentral.from_options(lambda m: [], {"slice": 4})
