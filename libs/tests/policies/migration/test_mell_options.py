"""The Mell packer's options beyond the paper: ``fill_first`` (item types mix) and ``compact``.

C = 1200 bytes throughout (``mell_helpers``): L (600, 1200], M (400, 600], S (300, 400], T (150, 300],
tiny ≤ 150. Each scenario runs a first epoch that only teaches the packer the cluster (nothing moves),
then the epoch under test.
"""

from __future__ import annotations

import pytest
from llmfleet.policies.migration.mell import MellOptions, MellPacker, MellView, allocate_target
from mell_helpers import gpu, idle, moves, taught


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
