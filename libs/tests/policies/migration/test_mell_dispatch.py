"""Mell's dispatch (``policies/dispatch/mell.py``): arrivals placed as the packer's Allocate would, over
its view.

C = 1200 bytes throughout (``mell_helpers``): L (600, 1200], M (400, 600], S (300, 400], T (150, 300],
tiny ≤ 150. Each scenario runs a first epoch that only teaches the packer the cluster (nothing moves),
then the epoch under test.
"""

from __future__ import annotations

import random

import pytest
from llmfleet.policies.dispatch.base import DispatchRequest, EngineCandidate, NoCandidate
from llmfleet.policies.dispatch.mell import MellDispatch
from llmfleet.policies.migration.mell import MellPacker, MellView
from mell_helpers import C, gpu, idle, moves, taught


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
