import random

import pytest
from llmfleet.policies.batching import (
    POLICIES,
    StaticBatch,
    StaticBatchPolicy,
    StaticSls,
    StaticSlsOptions,
    make_batching_policy,
    padded_blocks,
)
from llmfleet.policies.request import BatchLimits, PoolView, SchedRequest, stuck_requests

TPB = 16


def pool(free=10_000, watermark=0):
    return PoolView(free, watermark, {"m": TPB, "n": TPB})


def w(rid, arrival, prompt=15, model="m"):
    return SchedRequest(rid, "svc", model, arrival, prompt, 8)


def form(p, waiting, pl=None, limits=BatchLimits()):
    return p.form_batch(waiting, pl or pool(), limits, 0.0)


def test_fcfs_order_and_batch_size():
    waiting = [w(f"r{i:02d}", float(i)) for i in range(20)]
    random.Random(0).shuffle(waiting)
    assert form(StaticSls(StaticSlsOptions(batch_size=4)), waiting) == StaticBatch(
        "m", ("r00", "r01", "r02", "r03")
    )
    assert form(StaticSls(), waiting).request_ids == tuple(f"r{i:02d}" for i in range(16))  # default 16
    assert (
        len(
            form(
                StaticSls(StaticSlsOptions(batch_size=16)), waiting, limits=BatchLimits(max_requests=5)
            ).request_ids
        )
        == 5
    )


def test_same_arrival_ties_by_request_id():
    waiting = [w("b", 1.0), w("a", 1.0), w("c", 0.5)]
    assert form(StaticSls(StaticSlsOptions(batch_size=2)), waiting).request_ids == ("c", "a")


def test_padded_memory_fits_and_no_later_request_jumps_ahead():
    # prompts of 15 tokens: 1 block per row ((15 + 1) / 16); the 47-token prompt pads every row to 3 blocks
    waiting = [w("r0", 0, 15), w("r1", 1, 15), w("r2", 2, 15), w("big", 3, 47), w("r4", 4, 15)]
    b = form(StaticSls(), waiting, pool(free=8, watermark=2))  # 6 blocks above the watermark
    assert b.request_ids == ("r0", "r1", "r2")  # with "big": 4 rows x 3 blocks = 12 > 6; r4 must not jump it
    b = form(StaticSls(), waiting, pool(free=12))
    assert b.request_ids == ("r0", "r1", "r2", "big")  # 12 blocks fit exactly
    # memory, not the batch size, binds: 31-token prompts take 2 blocks a row, 7 blocks hold 3 rows
    waiting = [w(f"r{i}", i, 31) for i in range(6)]
    assert form(StaticSls(), waiting, pool(free=7)).request_ids == ("r0", "r1", "r2")


def test_batch_is_the_oldest_model_only():
    waiting = [w("n0", 0, model="n"), w("m0", 1), w("n1", 2, model="n"), w("m1", 3), w("n2", 4, model="n")]
    assert form(StaticSls(), waiting) == StaticBatch("n", ("n0", "n1", "n2"))
    assert form(StaticSls(), waiting[1:]) == StaticBatch("m", ("m0", "m1"))


def test_padded_prefill_tokens_within_limit_seed_exempt():
    waiting = [w(f"r{i}", i, 40) for i in range(4)]
    assert form(StaticSls(), waiting, limits=BatchLimits(max_prefill_tokens=100)).request_ids == ("r0", "r1")
    # padding counts: 3 rows x 60 = 180 > 150 although the real tokens are 40 + 40 + 60 = 140
    waiting = [w("r0", 0, 40), w("r1", 1, 40), w("r2", 2, 60)]
    assert form(StaticSls(), waiting, limits=BatchLimits(max_prefill_tokens=150)).request_ids == ("r0", "r1")
    long = [w("long", 0, 500), w("r1", 1, 10)]
    assert form(StaticSls(), long, limits=BatchLimits(max_prefill_tokens=100)).request_ids == ("long",)


def test_head_that_never_fits_is_passed_over_and_nothing_fitting_gives_none():
    waiting = [w("huge", 0, 1000), w("r1", 1), w("r2", 2)]
    pl = pool(free=10)  # "huge" needs 63 blocks alone
    assert form(StaticSls(), waiting, pl).request_ids == ("r1", "r2")
    assert [r.request_id for r in stuck_requests(waiting, [], pl)] == ["huge"]
    assert form(StaticSls(), waiting[:1], pl) is None
    assert form(StaticSls(), []) is None


def test_max_iterations_and_batch_done_bookkeeping():
    waiting = [w("r0", 0), w("r1", 1)]
    p = StaticSls(StaticSlsOptions(max_iterations=8))
    b = form(p, waiting)
    assert b == StaticBatch("m", ("r0", "r1"), 8)
    assert form(StaticSls(), waiting).max_iterations is None
    other = w("x", 2)
    p.on_batch_done(b, 2.0, 5.0, [*waiting, other])
    assert [(r.first_scheduled_s, r.last_run_s) for r in waiting] == [(3.0, 5.0), (3.0, 5.0)]
    assert other.first_scheduled_s is None
    with pytest.raises(ValueError):
        p.on_batch_done(b, float("nan"), 5.0, waiting)


def test_random_batches_always_fit():
    rng = random.Random(1)
    for _ in range(300):
        waiting = [
            w(f"r{i}", rng.random(), rng.randint(1, 200), rng.choice("mn")) for i in range(rng.randint(1, 30))
        ]
        pl = pool(free=rng.randint(0, 200), watermark=rng.randint(0, 5))
        lim = BatchLimits(max_requests=rng.randint(1, 32), max_prefill_tokens=rng.randint(1, 2000))
        size = rng.randint(1, 16)
        b = form(StaticSls(StaticSlsOptions(batch_size=size)), waiting, pl, lim)
        fitting = [r for r in waiting if padded_blocks(pl, [r], 1) <= pl.available_blocks]
        if not fitting:
            assert b is None
            continue
        by_id = {r.request_id: r for r in waiting}
        members = [by_id[i] for i in b.request_ids]
        assert members[0] is min(fitting, key=lambda r: (r.arrival_s, r.request_id))
        assert len(members) <= min(size, lim.max_requests)
        assert padded_blocks(pl, members, 1) <= pl.available_blocks
        assert (
            len(members) == 1
            or len(members) * max(r.prompt_tokens for r in members) <= lim.max_prefill_tokens
        )
        assert {r.model for r in members} == {b.model}
        same = sorted((r for r in waiting if r.model == b.model), key=lambda r: (r.arrival_s, r.request_id))
        start = same.index(members[0])
        assert members == same[start : start + len(members)]  # consecutive in FCFS order


def test_registry_and_validation():
    p = make_batching_policy("static_sls", batch_size=4, max_iterations=2)
    assert isinstance(p, StaticBatchPolicy) and (p.batch_size, p.max_iterations) == (4, 2)
    assert POLICIES["static_sls"] is StaticSls and p.name == "static_sls"
    with pytest.raises(ValueError, match=r"unknown batching policy 'x'.*static_sls"):
        make_batching_policy("x")
    with pytest.raises(ValueError, match=r"bad options for batching policy 'static_sls'.*slice_len"):
        make_batching_policy("static_sls", slice_len=3)
    for bad in ({"batch_size": 0}, {"max_iterations": 0}, {"batch_size": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            StaticSlsOptions(**bad)
