"""Mell's operation batching: the moves of one epoch composed, round trips and finished requests dropped.

C = 1200 bytes throughout (``mell_helpers``): L (600, 1200], M (400, 600], S (300, 400], T (150, 300],
tiny ≤ 150. Each scenario runs a first epoch that only teaches the packer the cluster (nothing moves),
then the epoch under test.
"""

from __future__ import annotations

from llmfleet.policies.migration.base import GpuState
from mell_helpers import gpu, idle, moves, taught


def _round_trip_cluster(t3_to_other_l: bool) -> tuple[list[GpuState], list[GpuState]]:
    """g0 (an L-GPU, not the most recent) loses t1; its Depart pulls t3 from the T-GPU g1. Then an M
    arrival (z_m, on an opened GPU) takes g0 and pushes its T items away: t3 back to g1 (a round trip)
    or, with a second L-GPU with room (g4), on to g4 (a chain)."""
    before = [
        gpu("g0", ("l", 700), ("t1", 250), ("t2", 200)),
        gpu("g1", ("t3", 240), ("t4", 200)),
        gpu("g2", ("l2", 1100)),
    ]
    if t3_to_other_l:
        before.append(gpu("g4", ("l3", 640), ("s", 310)))  # an L-GPU with an S and 250 B free
    after = [gpu("g0", ("l", 700), ("t2", 200)), *before[1:], gpu("g3", ("z_m", 450), active=False)]
    return before, after


def test_batching_drops_a_round_trip():
    before, after = _round_trip_cluster(t3_to_other_l=False)
    p = taught(*before)
    plan = p.epoch(after, 1.0)
    assert sorted(moves(plan)) == [("t2", "g0", "g1"), ("z_m", "g3", "g0")]  # t3: g1→g0→g1 dropped
    assert plan.cancelled == 2
    q = taught(*before, batching=False)
    unbatched = q.epoch(after, 1.0)
    assert sorted(moves(unbatched)) == [
        ("t2", "g0", "g1"), ("t3", "g0", "g1"), ("t3", "g1", "g0"), ("z_m", "g3", "g0"),
    ]  # fmt: skip
    assert unbatched.cancelled == 0 and len(unbatched.migrations) > len(plan.migrations)
    # per request the moves keep their order (g1→g0 before g0→g1)
    assert [m.destination for m in unbatched.migrations if m.request_id == "t3"] == ["g0", "g1"]


def test_batching_composes_a_chain():
    before, after = _round_trip_cluster(t3_to_other_l=True)
    p = taught(*before)
    plan = p.epoch(after, 1.0)
    assert sorted(moves(plan)) == [("t2", "g0", "g1"), ("t3", "g1", "g4"), ("z_m", "g3", "g0")]  # g1→g0→g4
    assert plan.cancelled == 1
    unbatched = taught(*before, batching=False).epoch(after, 1.0)
    assert len(unbatched.migrations) == 4


def test_batching_drops_the_move_of_a_finished_request():
    before = [
        gpu("g0", ("l", 700), ("t1", 250), ("t2", 200)),
        gpu("g1", ("t3", 200), ("t4", 240)),
        gpu("g2", ("l2", 1100)),
    ]
    p = taught(*before)
    # t1 and t4 finish. Depart(t1) refills g0 with the largest T of the most recent T-GPU: t4, which has
    # finished too (its own Depart comes next and refills g0 again, with t3)
    plan = p.epoch([gpu("g0", ("l", 700), ("t2", 200)), gpu("g1", ("t3", 200)), before[2]], 1.0)
    assert moves(plan) == [("t3", "g1", "g0")]
    assert plan.cancelled == 1 and plan.operations == 2
    assert plan.deactivate == ("g1",)


def test_deferred_moves_are_planned_again_under_their_first_id():
    gpus = [gpu("g0", ("l", 700)), idle("g1")]
    p = taught(*gpus)
    plan = p.epoch([gpu("g0", ("l", 700)), gpu("g1", ("t", 250), active=False)], 1.0)
    (mig,) = plan.migrations
    again = p.epoch([gpu("g0", ("l", 700)), gpu("g1", ("t", 260))], 2.0)  # not moved yet
    assert [(m.migration_id, m.source, m.destination) for m in again.migrations] == [
        (mig.migration_id, "g1", "g0")
    ]
    assert p.epoch([gpu("g0", ("l", 700), ("t", 270)), idle("g1")], 3.0).migrations == ()  # done


def test_multi_items_move_as_one_and_only_to_gpus_hosting_their_model():
    a, b = ("a",), ("b",)
    gpus = [
        gpu("g0", ("t1", 250), ("t2", 250), ("t3", 250), ("t4", 250), models=a),
        gpu("g1", ("x1", 100), ("x2", 90), models=a),  # two tiny requests: one multi-item (a T item)
        gpu("g2", ("y1", 200), ("y2", 200), models=b),  # the most recent T-GPU, but of model b
    ]
    p = taught(*gpus)
    plan = p.epoch([gpu("g0", ("t2", 250), ("t3", 250), ("t4", 250), models=a), *gpus[1:]], 1.0)
    # t1's Depart refills g0 from the most recent T-GPU holding a T item of a model g0 hosts: g1
    assert moves(plan) == [("x1", "g1", "g0"), ("x2", "g1", "g0")]
    assert p.last_op_moves == (1,)  # one item moved
    assert plan.deactivate == ("g1",)
