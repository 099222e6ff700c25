"""Mell's packer (``policies/migration/mell.py``): size classes, its operations Allocate, Depart and Update,
and its counters.

C = 1200 bytes throughout (``mell_helpers``): L (600, 1200], M (400, 600], S (300, 400], T (150, 300],
tiny ≤ 150. Each scenario runs a first epoch that only teaches the packer the cluster (nothing moves),
then the epoch under test.
"""

from __future__ import annotations

import json

from llmfleet.policies.migration.base import MigrationPolicy
from llmfleet.policies.migration.mell import MAX_MOVES_PER_OP, MellView, allocate_target
from llmfleet.policies.migration.mell_classes import TINY, L, M, S, T, pack_bundles, size_class
from mell_helpers import C, gpu, idle, moves, taught


def test_size_classes_and_multi_items():
    assert [size_class(s, C) for s in (1200, 601, 600, 401, 400, 301, 300, 151, 150, 0)] == [
        L, L, M, M, S, S, T, T, TINY, TINY,
    ]  # fmt: skip
    # a multi-item grown past C/4 sheds members; incomplete ones merge; loose tiny requests join
    out = pack_bundles([("b1", [("a", 140), ("b", 100), ("c", 90)]), ("b2", [("d", 60)])], [("e", 30)], C)
    assert out == [("b1", [("a", 140), ("b", 100), ("e", 30)]), ("b2", [("d", 60), ("c", 90)])]
    assert all(sum(s for _, s in m) <= C // 4 for _, m in out)


def test_is_a_migration_policy_and_view_round_trips():
    p = taught(gpu("g0", ("l", 700)), gpu("g1", ("t1", 200), ("t2", 200)), idle("g2"))
    assert isinstance(p, MigrationPolicy)
    v = p.view()
    assert v.capacity_bytes == C and {g.gpu_id: g.kind for g in v.gpus} == {"g0": L, "g1": T}
    assert MellView.from_json(v.to_json()) == v
    assert MellView.from_json(json.dumps(v.to_json())) == v  # also from JSON text (etcd)


# ------------------------------------------------------------------------------------------ Allocate


def test_allocate_t_prefers_an_l_gpu_with_room_then_the_most_recent_t_gpu_then_opens():
    view = taught(gpu("g0", ("l", 1000)), gpu("g1", ("t1", 200), ("t2", 200)), idle("g2")).view()
    gpus = [gpu("g0", ("l", 700)), gpu("g1", ("t1", 200)), idle("g2")]
    assert allocate_target(view, gpus, "m", 250) == "g0"  # beside the L
    gpus[0] = gpu("g0", ("l", 1000))
    assert allocate_target(view, gpus, "m", 250) == "g1"  # L full: the most recent T-GPU
    gpus[1] = gpu("g1", ("t1", 300), ("t2", 300), ("t3", 300), ("t4", 250))
    assert allocate_target(view, gpus, "m", 250) == "g2"  # both full: open a GPU
    assert allocate_target(view, gpus, "other", 250) is None  # nothing hosts the model


def test_packer_moves_a_t_arrival_onto_an_l_gpu_with_room():
    p = taught(gpu("g0", ("l", 700)), idle("g1"))
    # another dispatcher opened g1 for a T request: Allocate puts it beside the L instead
    plan = p.epoch([gpu("g0", ("l", 700)), gpu("g1", ("t", 250), active=False)], 1.0)
    assert moves(plan) == [("t", "g1", "g0")]
    assert plan.activate == () and plan.deactivate == ()  # g1 was never active: nothing to close
    assert plan.operations == 1


def test_an_arrival_where_allocate_puts_it_does_not_move():
    p = taught(gpu("g0", ("l", 700)), gpu("g1", ("t1", 200), ("t2", 200)), idle("g2"))
    gpus = [gpu("g0", ("l", 700)), gpu("g1", ("t1", 200), ("t2", 200)), idle("g2")]
    target = allocate_target(p.view(), gpus, "m", 250)
    gpus = [
        g
        if g.gpu_id != target
        else gpu(target, *[(r.request_id, r.kv_bytes) for r in g.requests], ("new", 250))
        for g in gpus
    ]
    assert p.epoch(gpus, 1.0).migrations == ()


def test_s_m_onto_an_l_gpu_pushes_its_t_items_away():
    p = taught(gpu("g0", ("l", 700), ("t1", 200), ("t2", 250)), gpu("g1", ("t3", 200)), idle("g2"))
    # an M arrival sits on an opened GPU; the L-GPU takes it (700 + 450 < C) once its T items leave
    plan = p.epoch(
        [
            gpu("g0", ("l", 700), ("t1", 200), ("t2", 250)),
            gpu("g1", ("t3", 200)),
            gpu("g2", ("m", 450), active=False),
        ],
        1.0,
    )
    assert sorted(moves(plan)) == [("m", "g2", "g0"), ("t1", "g0", "g1"), ("t2", "g0", "g1")]
    assert p.view().by_id["g0"].kind == L


def test_l_opens_a_gpu_pulls_one_s_m_request_and_the_source_is_refilled():
    # g0: an older S-GPU with two S; g1: the most recent S-GPU, full
    p = taught(
        gpu("g0", ("s1", 350), ("s2", 350)), gpu("g1", ("s3", 330), ("s4", 340), ("s5", 350)), idle("g2")
    )
    plan = p.epoch(
        [
            gpu("g0", ("s1", 350), ("s2", 350)),
            gpu("g1", ("s3", 330), ("s4", 340), ("s5", 350)),
            gpu("g2", ("big", 700), active=False),  # the dispatcher opened g2 for the L request
        ],
        1.0,
    )
    # the L stays on the GPU opened for it and pulls an S from the S-GPU with the highest priority for
    # it (fewer requests: g0); g0 is refilled from the most recently activated S-GPU (g1)
    assert moves(plan) == [("s2", "g0", "g2"), ("s5", "g1", "g0")]
    assert plan.activate == ("g2",)
    assert p.last_op_moves == (2,)


def test_the_migration_cap_bounds_one_operation():
    gpus = [gpu("g0", ("s1", 350), ("s2", 350)), gpu("g1", ("s3", 330), ("s4", 340), ("s5", 350)), idle("g2")]
    p = taught(*gpus, max_moves_per_op=1)
    plan = p.epoch([*gpus[:2], gpu("g2", ("big", 700), active=False)], 1.0)
    assert moves(plan) == [("s2", "g0", "g2")]  # the refill would be the second move
    assert p.last_op_moves == (1,)
    assert MAX_MOVES_PER_OP == 10


# ------------------------------------------------------------------------------------------ Depart


def test_depart_t_refills_from_the_most_recent_t_gpu():
    gpus = [
        gpu("g0", ("t1", 250), ("t2", 250), ("t3", 250), ("t4", 250)),
        gpu("g1", ("t5", 200), ("t6", 220)),
    ]
    p = taught(*gpus)
    plan = p.epoch([gpu("g0", ("t2", 250), ("t3", 250), ("t4", 250)), gpus[1]], 1.0)
    assert moves(plan) == [("t6", "g1", "g0")]  # the largest T of the most recent T-GPU that fits
    # a departure from the most recent GPU of its type only removes the request
    assert p.epoch([gpu("g0", ("t2", 250), ("t3", 250), ("t4", 250), ("t6", 220))], 2.0).migrations == ()


def test_depart_s_from_an_l_gpu_pulls_an_s_m_request_and_an_emptied_gpu_is_closed():
    gpus = [
        gpu("g0", ("l", 700), ("s", 350)),
        gpu("g1", ("s1", 350), ("s2", 350), ("s3", 330)),
        gpu("g2", ("s4", 340)),  # the most recent S-GPU, and the one with the fewest requests
        gpu("g3", ("l2", 1100)),  # the most recent L-GPU (there a departure would only remove)
    ]
    p = taught(*gpus)
    plan = p.epoch([gpu("g0", ("l", 700)), *gpus[1:]], 1.0)
    assert moves(plan) == [("s4", "g2", "g0")]
    assert plan.deactivate == ("g2",)


def test_depart_l_reallocates_the_rest_of_its_gpu():
    gpus = [gpu("g0", ("l", 700), ("m1", 450)), gpu("g1", ("m2", 450)), gpu("g2", ("l2", 1100))]
    p = taught(*gpus)
    plan = p.epoch([gpu("g0", ("m1", 450)), gpus[1], gpus[2]], 1.0)
    # m1 goes to the most recent M-GPU with room (g1), and g0 closes
    assert moves(plan) == [("m1", "g0", "g1")]
    assert plan.deactivate == ("g0",)


# ------------------------------------------------------------------------------------------ Update


def test_update_m_to_l_on_an_l_gpu_reallocates_it():
    gpus = [gpu("g0", ("l", 700), ("m", 450)), idle("g1")]
    p = taught(*gpus)
    plan = p.epoch([gpu("g0", ("l", 750), ("m", 650)), idle("g1")], 1.0)  # m grew into an L
    assert moves(plan) == [("m", "g0", "g1")]  # Allocate L opens a GPU
    assert plan.activate == ("g1",)


def test_update_m_to_l_on_an_m_gpu_that_overflows_reallocates_the_others():
    gpus = [gpu("g0", ("m1", 450), ("m2", 500)), gpu("g1", ("m3", 450)), idle("g2")]
    p = taught(*gpus)
    plan = p.epoch([gpu("g0", ("m1", 450), ("m2", 800)), gpus[1], idle("g2")], 1.0)
    assert moves(plan) == [("m1", "g0", "g1")]  # m2 keeps g0 (now an L-GPU); m1 to the M-GPU with room
    assert p.view().by_id["g0"].kind == L


def test_update_t_to_s_leaves_the_t_gpu_for_an_s_gpu_and_the_t_gpu_is_refilled():
    gpus = [
        gpu("g0", ("t1", 250), ("t2", 250), ("t3", 250), ("t4", 250)),
        gpu("g1", ("s1", 350)),
        gpu("g2", ("t5", 220)),  # the most recent T-GPU (t5 did not fit g0)
    ]
    p = taught(*gpus)
    plan = p.epoch([gpu("g0", ("t1", 250), ("t2", 250), ("t3", 250), ("t4", 320)), gpus[1], gpus[2]], 1.0)
    assert moves(plan) == [("t4", "g0", "g1"), ("t5", "g2", "g0")]
    assert plan.deactivate == ("g2",)


def test_overload_check_evicts_t_items_first_then_the_smallest_others():
    gpus = [gpu("g0", ("l", 700), ("t1", 200), ("t2", 250)), gpu("g1", ("t3", 200))]
    p = taught(*gpus)
    plan = p.epoch([gpu("g0", ("l", 800), ("t1", 200), ("t2", 250)), gpus[1]], 1.0)  # L grew inside L
    assert moves(plan) == [("t1", "g0", "g1")]  # the smallest T whose leaving ends the overload
    p = taught(gpu("g0", ("l", 650), ("s", 350)), gpu("g1", ("s1", 350)))
    plan = p.epoch([gpu("g0", ("l", 900), ("s", 350)), gpu("g1", ("s1", 350))], 1.0)
    assert moves(plan) == [("s", "g0", "g1")]  # no T: the smallest other item


def test_counters_count_gpu_openings_by_cause():
    p = taught(gpu("g0", ("a", 250), ("b", 250), ("c", 250)), idle("g1"), idle("g2"))
    assert p.counters() == {"opened_arrival": 1, "room_arrival": 0}  # the first GPU to hold requests
    # "a" grows from T to S: Update departs and re-allocates it; no S-GPU exists, so it opens one
    plan = p.epoch([gpu("g0", ("a", 350), ("b", 250), ("c", 250)), idle("g1"), idle("g2")], 1.0)
    (dst,) = plan.activate
    assert moves(plan) == [("a", "g0", dst)]
    assert p.counters() == {"opened_arrival": 1, "opened_update": 1, "room_arrival": 0, "room_update": 0}
    # the dispatcher puts an arrival on the GPU the last plan left empty while g0 still has room for it
    empty = "g2" if dst == "g1" else "g1"
    now = [gpu("g0", ("b", 250), ("c", 250)), gpu(dst, ("a", 350)), gpu(empty, ("n", 200), active=False)]
    p.epoch(now, 2.0)
    assert p.counters() == {"opened_arrival": 2, "opened_update": 1, "room_arrival": 1, "room_update": 0}
