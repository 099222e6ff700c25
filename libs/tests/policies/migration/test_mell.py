"""Mell's packer (``policies/migration/mell.py``) and dispatch (``policies/dispatch/mell.py``).

C = 1200 bytes throughout: L (600, 1200], M (400, 600], S (300, 400], T (150, 300], tiny ≤ 150.
Each scenario runs a first epoch that only teaches the packer the cluster (nothing moves), then the
epoch under test.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmfleet.policies.dispatch.base import DispatchRequest, EngineCandidate, NoCandidate
from llmfleet.policies.dispatch.mell import MellDispatch
from llmfleet.policies.migration.base import EpochPlan, GpuState, MigrationPolicy, RequestState
from llmfleet.policies.migration.mell import (
    MAX_MOVES_PER_OP,
    MellOptions,
    MellPacker,
    MellView,
    allocate_target,
)
from llmfleet.policies.migration.mell_classes import TINY, L, M, S, T, pack_bundles, size_class

C = 1200


def gpu(gid: str, *reqs: tuple[str, int], active: bool = True, models=("m",), machine: str = "") -> GpuState:
    return GpuState(gid, models, C, tuple(RequestState(r, models[0], s) for r, s in reqs), active, machine)


def idle(gid: str) -> GpuState:
    return gpu(gid, active=False)


def moves(plan: EpochPlan) -> list[tuple[str, str, str]]:
    return [(m.request_id, m.source, m.destination) for m in plan.migrations]


def taught(*gpus: GpuState, **kw) -> MellPacker:
    """A packer that has seen ``gpus`` once (and moved nothing)."""
    p = MellPacker(MellOptions(**kw))
    plan = p.epoch(gpus, 0.0)
    assert plan.migrations == (), moves(plan)
    return p


# ------------------------------------------------------------------------------------------ classes


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


# ------------------------------------------------------------------------------------------ batching


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


# ------------------------------------------------------------------------------------------ dispatch


def cand(eid: str, used: int, running: int = 1, cap: int = C, models=("m",)) -> EngineCandidate:
    return EngineCandidate(eid, models, running, 0, used, cap)


def req(prompt: int, predicted: float = 0.0) -> DispatchRequest:
    return DispatchRequest(
        "r", "m", prompt_tokens=prompt, predicted_output_tokens=predicted, kv_bytes_per_token=1
    )


def test_mell_dispatch_places_as_allocate_by_the_current_size():
    view = taught(gpu("e0", ("l", 700)), gpu("e1", ("t1", 300), ("t2", 300), ("t3", 200)), idle("e2")).view()
    d = MellDispatch(lambda: view)
    cands = [cand("e0", 700), cand("e1", 800, running=3), cand("e2", 0, running=0)]
    # an M request (prompt 450 B now; its predicted end size does not matter): beside the L, where best
    # fit by the end size would pick the T-GPU e1
    assert d.choose("m", cands, request=req(450, predicted=5000)) == "e0"
    assert d.choose("m", cands, request=req(250)) == "e0"  # T beside the L
    assert d.choose("m", cands, request=req(700)) == "e2"  # L opens the idle engine
    assert d.choose("m", cands, frozenset({"e2"}), request=req(700)) == "e0"  # none to open: best fit
    with pytest.raises(NoCandidate):
        d.choose("other", cands, request=req(10))
    assert d.needs.reads_kv and d.needs.reads_queue and not d.needs.reads_predictions


def test_mell_dispatch_keeps_the_type_of_a_gpu_it_opened_since_the_view():
    """A dispatcher sees a busy engine as one sum of KV. A GPU opened for a T item since the packer's
    last epoch is a T-GPU (the most recent one) however its T items add up: further T arrivals go there
    instead of opening yet another GPU (before: two T items of 250 B read as one 500 B M item, and
    every T arrival in a burst opened a GPU)."""
    view = taught(
        gpu("e0", ("t1", 300), ("t2", 300), ("t3", 300), ("t4", 250)), idle("e1"), idle("e2")
    ).view()
    d = MellDispatch(lambda: view)
    cands = [cand("e0", 1150), cand("e1", 0, running=0), cand("e2", 0, running=0)]
    assert d.choose("m", cands, request=req(250)) == "e1"  # e0 full: open a GPU
    cands[1] = cand("e1", 500, running=2)  # it took two T items
    assert d.choose("m", cands, request=req(250)) == "e1"
    cands[1] = cand("e1", 1000, running=4)
    assert d.choose("m", cands, request=req(250)) == "e2"  # full: open the next one
    cands[2] = cand("e2", 250)
    assert d.choose("m", cands, request=req(250)) == "e2"  # the most recently opened T-GPU
    # the memo is the view's: the packer's next epoch makes a new view, a JSON copy starts empty
    assert MellView.from_json(view.to_json()).opened == {}


# ------------------------------------------------------------------------------------------ fill_first


def test_fill_first_puts_an_item_on_an_active_gpu_of_another_type_before_opening():
    """Paper (default): a T item never joins an S-GPU, so with the T-GPU full a new GPU opens. With
    ``fill_first`` it goes to the active GPU with the least room left that fits, and the view carries
    the option to dispatch."""
    gpus = [gpu("g0", ("s1", 350), ("s2", 350)), gpu("g1", ("t1", 300), ("t2", 300), ("t3", 300), ("t4", 200)),
            idle("g2")]  # fmt: skip
    assert allocate_target(taught(*gpus).view(), gpus, "m", 200) == "g2"
    v = taught(*gpus, fill_first=True).view()
    assert v.fill_first and MellView.from_json(v.to_json()).fill_first
    assert allocate_target(v, gpus, "m", 200) == "g0"
    assert allocate_target(v, gpus, "m", 100 + 150) == "g0"  # g1 has 100 B left: only g0 fits
    # an item already there stays (no move), and the packer does not move it either
    arrived = [gpu("g0", ("s1", 350), ("s2", 350), ("t5", 200)), *gpus[1:]]
    assert allocate_target(v, arrived, "m", 200, source="g0") == "g0"
    p = taught(*gpus, fill_first=True)
    assert p.epoch(arrived, 1.0).migrations == ()
    p = taught(*gpus)  # the paper's packer moves it to a GPU of its own (opening g2)
    plan = p.epoch(arrived, 1.0)
    assert moves(plan) == [("t5", "g0", "g2")] and plan.activate == ("g2",)


def test_fill_first_prefers_the_paper_targets_when_they_have_room():
    gpus = [gpu("g0", ("s1", 350), ("s2", 350)), gpu("g1", ("t1", 300), ("t2", 300)), idle("g2")]
    v = taught(*gpus, fill_first=True).view()
    assert allocate_target(v, gpus, "m", 200) == "g1"  # the most recent T-GPU has room
    assert allocate_target(v, gpus, "m", 350) == "g0"  # the most recent S-GPU
    assert allocate_target(v, gpus, "m", 700) == "g2"  # no active GPU has room for an L: open


def test_compact_empties_the_least_filled_gpu_into_the_others_room():
    """``compact`` (beyond the paper): a GPU whose items fit in the others' room (keeping 5 % of C free
    there) is emptied and closed; the paper's packer leaves the three GPUs as they are."""
    gpus = [
        gpu("g0", ("t1", 300), ("t2", 300), ("t3", 200)),
        gpu("g1", ("s1", 350), ("s2", 350)),
        gpu("g2", ("t4", 250), ("t5", 160)),
    ]
    assert taught(*gpus).epoch(gpus, 1.0).migrations == ()
    p = taught(*gpus)
    p.compact = True
    plan = p.epoch(gpus, 1.0)
    # largest first, best fit with 60 B kept free: t4 (250) to g0 (340 → 90), t5 (160) to g1 (440)
    assert sorted(moves(plan)) == [("t4", "g2", "g0"), ("t5", "g2", "g1")]
    assert plan.deactivate == ("g2",)
    # no room once 5 % of C is kept free: nothing moves
    tight = [
        gpu("g0", ("t1", 300), ("t2", 300), ("t3", 300)),
        gpu("g1", ("s1", 350), ("s2", 350), ("s3", 350)),
        gpus[2],
    ]
    p = taught(*tight)
    p.compact = True
    assert p.epoch(tight, 1.0).migrations == ()
    with pytest.raises(ValueError, match="compact_headroom"):
        MellPacker(MellOptions(compact=True, compact_headroom=1.0))


def test_mell_dispatch_without_a_view_is_best_fit_by_free_kv():
    cands = [cand("e0", 700), cand("e1", 800, running=3), cand("e2", 0, running=0)]
    assert MellDispatch().choose("m", cands, request=req(300)) == "e1"  # least free that fits
    assert MellDispatch(lambda: None).choose("m", cands, request=req(450)) == "e0"
    assert (
        MellDispatch(lambda: MellView()).choose("m", cands, request=req(2000)) == "e2"
    )  # none fits: most free


def test_mell_dispatch_agrees_with_the_packer():
    """Arrivals dispatched by MellDispatch over the packer's view stay where they are sent."""
    rng = random.Random(7)
    p = MellPacker()
    d = MellDispatch(p.view)
    place: dict[str, dict[str, int]] = {f"e{i}": {} for i in range(12)}
    for e in range(6):
        for k in range(4):
            size = rng.choice(
                [rng.randint(20, 140), rng.randint(160, 290), rng.randint(310, 580), rng.randint(620, 1000)]
            )
            cands = [cand(g, sum(v.values()), running=len(v)) for g, v in sorted(place.items())]
            place[d.choose("m", cands, request=req(size))][f"r{e}{k}"] = size
        plan = p.epoch(
            [gpu(g, *sorted(v.items()), active=bool(v)) for g, v in sorted(place.items())], float(e)
        )
        assert plan.migrations == (), moves(plan)


# ------------------------------------------------------------------------------------------ properties


def lower_bound(sizes: Sequence[int], cap: int = C) -> int:
    """A lower bound on OPT, the fewest GPUs that hold ``sizes`` now: the fluid bound ⌈ΣS/C⌉ and
    Martello–Toth's L2 (items above C/2 need a GPU each; items of at least α fill what those leave)."""
    best = math.ceil(sum(sizes) / cap)
    for alpha in {0, *(s for s in sizes if 2 * s <= cap)}:
        big = [s for s in sizes if s > cap - alpha]
        mid = [s for s in sizes if cap - alpha >= s and 2 * s > cap]
        small = sum(s for s in sizes if 2 * s <= cap and s >= alpha)
        spare = len(mid) * cap - sum(mid)
        best = max(best, len(big) + len(mid) + max(0, math.ceil((small - spare) / cap)))
    return best


def apply(
    plan: EpochPlan, place: dict[str, dict[str, int]], rng: random.Random | None = None, p: float = 1.0
):
    """Run the plan's migrations in order (each from where its request is). With ``rng``, each runs
    with probability ``p`` and only if its destination has room (an executor deferring some)."""
    for m in plan.migrations:
        assert m.request_id in place[m.source] or rng is not None, f"{m} does not start where its request is"
        size = place[m.source].get(m.request_id)
        if rng is not None and (
            size is None or rng.random() > p or sum(place[m.destination].values()) + size > C
        ):
            continue
        place[m.destination][m.request_id] = place[m.source].pop(m.request_id)


SIZES = st.one_of(st.integers(1, C // 8), st.integers(C // 8, C // 2), st.integers(C // 2, C))
EPOCHS = st.lists(
    st.tuples(st.lists(SIZES, max_size=6), st.integers(0, C // 8), st.integers(0, 2**32 - 1)),
    min_size=1,
    max_size=16,
)


def simulate(
    epochs,
    batching: bool,
    hosts: dict[str, tuple[str, ...]],
    models: Sequence[str],
    executed: float = 1.0,
    fill_first: bool = False,
    compact: bool = False,
) -> dict[str, float]:
    """Random arrivals (dispatched as Allocate would: ``allocate_target`` over the packer's view),
    growth and departures; each plan is checked on the state it plans (all its migrations applied),
    and then ``executed`` of its migrations run (the rest are deferred: the packer sees that)."""
    p = MellPacker(MellOptions(batching=batching, fill_first=fill_first, compact=compact))
    place: dict[str, dict[str, int]] = {g: {} for g in hosts}
    model_of: dict[str, str] = {}
    active: set[str] = set()
    n = 0
    peak_active = peak_lb = peak_fluid = 0
    for arrivals, grow, seed in epochs:
        rng = random.Random(seed)
        for v in place.values():
            for rid in sorted(v):
                if rng.random() < 0.15:
                    del v[rid]  # finished
                else:
                    v[rid] = min(C, v[rid] + rng.randint(0, grow))  # KV grows (engines may overflow)
        for size in arrivals:
            n += 1
            rid, model = f"r{n:03d}", models[n % len(models)]
            states = [state(g, place, model_of, hosts, active) for g in hosts]
            target = allocate_target(p.view(), states, model, size)
            if target is not None:
                place[target][rid] = size
                model_of[rid] = model
        expected = Counter(rid for v in place.values() for rid in v)
        plan = p.epoch([state(g, place, model_of, hosts, active) for g in hosts], 0.0)
        assert max(p.last_op_moves, default=0) <= MAX_MOVES_PER_OP
        planned = {g: dict(v) for g, v in place.items()}
        apply(plan, planned)
        assert Counter(rid for v in planned.values() for rid in v) == expected  # each in exactly one place
        assert all(model_of[rid] in hosts[g] for g, v in planned.items() for rid in v)
        assert set(plan.deactivate) <= {g for g, v in planned.items() if not v}
        assert set(plan.activate) <= {g for g, v in planned.items() if v}
        opened = (active | set(plan.activate) | {g for g, v in planned.items() if v}) - set(plan.deactivate)
        if len(opened) < len(hosts):  # an idle GPU was there to open: nothing may stay over capacity
            assert all(sum(v.values()) <= C for v in planned.values()), plan.notes
        if executed < 1.0:
            apply(plan, place, rng, executed)
        else:
            place = planned
        active = (opened | {g for g, v in place.items() if v}) - {g for g, v in place.items() if not v}
        sizes = [s for v in place.values() for s in v.values()]
        peak_active = max(peak_active, sum(1 for v in place.values() if v))
        peak_lb = max(peak_lb, lower_bound(sizes))
        peak_fluid = max(peak_fluid, math.ceil(sum(sizes) / C))
    return {"active": peak_active, "lb": peak_lb, "fluid": peak_fluid}


def state(g: str, place, model_of, hosts, active) -> GpuState:
    reqs = tuple(RequestState(r, model_of[r], s) for r, s in sorted(place[g].items()))
    return GpuState(g, hosts[g], C, reqs, g in active)


ADDITIVE = 3


def test_random_epochs_keep_capacity_and_stay_within_4_3_of_opt():
    """After every epoch: no GPU over capacity, each request in exactly one place, at most 10 moves per
    operation. Peak active GPUs ≤ 4/3 · LB + 3, LB a lower bound on OPT's peak (``lower_bound``).

    Why not the fluid bound ⌈ΣKV/C⌉ alone: Theorem 2 compares with OPT, and OPT itself can be twice
    the fluid bound (every item just above C/2 needs its own GPU), so LB adds Martello–Toth's L2
    (≤ OPT). The additive 3: Theorem 2 is asymptotic, "with a constant number of exceptions" (Theorem
    1): the most recently activated T-, S- and M-GPU may each be nearly empty — one GPU per class
    whose GPUs are filled in activation order. The printed ratios are also given for runs whose peak
    LB is at least 6 GPUs, where the additive constant weighs less."""
    worst = {"ratio": 0.0, "fluid_ratio": 0.0, "excess": -math.inf, "ratio6": 0.0, "fluid_ratio6": 0.0}
    hosts = {f"g{i:02d}": ("m",) for i in range(100)}

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(EPOCHS, st.booleans())
    def check(epochs, batching):
        peak = simulate(epochs, batching, hosts, ("m",))
        assert peak["active"] <= 4 / 3 * peak["lb"] + ADDITIVE, peak
        if peak["lb"]:
            worst["ratio"] = max(worst["ratio"], peak["active"] / peak["lb"])
            worst["fluid_ratio"] = max(worst["fluid_ratio"], peak["active"] / max(peak["fluid"], 1))
            worst["excess"] = max(worst["excess"], peak["active"] - 4 / 3 * peak["lb"])
        if peak["lb"] >= 6:
            worst["ratio6"] = max(worst["ratio6"], peak["active"] / peak["lb"])
            worst["fluid_ratio6"] = max(worst["fluid_ratio6"], peak["active"] / peak["fluid"])

    check()
    print(
        f"\nMell worst peak active GPUs: {worst['ratio']:.3f} x LB, {worst['fluid_ratio']:.3f} x fluid bound "
        f"(peak LB >= 6: {worst['ratio6']:.3f} x LB, {worst['fluid_ratio6']:.3f} x fluid); "
        f"worst peak - 4/3 LB = {worst['excess']:.2f} GPUs (allowed {ADDITIVE})"
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EPOCHS, st.sampled_from([1.0, 0.5]))
def test_random_epochs_with_several_models_and_deferred_moves_keep_every_invariant(epochs, executed):
    """Engines host different model sets (a GPU is one bin whatever its requests' models), and an
    executor may run only some migrations (the rest are planned again while they fit)."""
    hosts = {f"g{i:02d}": (("a",), ("b",), ("a", "b"))[i % 3] for i in range(60)}
    simulate(epochs, True, hosts, ("a", "b"), executed)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EPOCHS, st.booleans(), st.sampled_from([1.0, 0.5]), st.booleans())
def test_fill_first_and_compact_keep_every_invariant_and_the_peak_bound(epochs, batching, executed, compact):
    """The ``fill_first`` option (types mix), with or without ``compact``, keeps capacity, one place per
    request and the 10-move cap, also with several models and deferred moves, and its peak stays within
    4/3 · LB + 3."""
    hosts = {f"g{i:02d}": ("m",) for i in range(100)}
    peak = simulate(epochs, batching, hosts, ("m",), executed, fill_first=True, compact=compact)
    assert peak["active"] <= 4 / 3 * peak["lb"] + ADDITIVE, peak
    mixed = {f"g{i:02d}": (("a",), ("b",), ("a", "b"))[i % 3] for i in range(60)}
    simulate(epochs, batching, mixed, ("a", "b"), executed, fill_first=True, compact=compact)


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
