import pytest
from llmfleet.policies.request import (
    Batch,
    BatchLimits,
    Fcfs,
    FcfsOptions,
    PoolView,
    SchedRequest,
    make_request_policy,
)

BIG = PoolView(free_blocks=10_000, watermark_blocks=0, tokens_per_block={"a": 16, "b": 16})


def w(rid, arrival, model="a", prompt=15):
    return SchedRequest(rid, model, model, arrival, prompt, 8)


def d(rid, arrival, model="a", prompt=15):
    return SchedRequest(rid, model, model, arrival, prompt, 8, generated=1, phase="decode")


def test_prefills_in_arrival_order_ties_by_id():
    waiting = [w("c", 2.0), w("b", 1.0), w("a2", 1.0)]
    b = Fcfs().next_batch(waiting, [], BIG, BatchLimits(), now=3.0)
    assert b == Batch("a", "prefill", ("a2", "b", "c"))


def test_mixes_decodes_and_prefills_of_one_model():
    b = Fcfs().next_batch([w("p", 2.0)], [d("x", 1.0)], BIG, BatchLimits(), 3.0)
    assert b == Batch("a", "mixed", ("x", "p"))
    assert Fcfs().next_batch([], [d("y", 1.5), d("x", 1.0)], BIG, BatchLimits(), 3.0) == Batch(
        "a", "decode", ("x", "y")
    )


def test_model_of_the_oldest_request_only():
    waiting = [w("a1", 1.0, "a"), w("b1", 0.5, "b"), w("b2", 2.0, "b")]
    running = [d("a0", 0.9, "a")]
    b = Fcfs().next_batch(waiting, running, BIG, BatchLimits(), 3.0)
    assert b == Batch("b", "prefill", ("b1", "b2"))  # b1 is the oldest overall
    b = Fcfs().next_batch(waiting[:1], running, BIG, BatchLimits(), 3.0)
    assert b == Batch("a", "mixed", ("a0", "a1"))


def test_falls_back_to_next_model_when_oldest_cannot_run_and_nothing_runs():
    pool = PoolView(5, 0, {"a": 16, "b": 16})  # 80 tokens
    waiting = [w("huge", 0.0, "a", prompt=500), w("b1", 1.0, "b")]
    assert Fcfs().next_batch(waiting, [], pool, BatchLimits(), 2.0) == Batch("b", "prefill", ("b1",))
    assert Fcfs().next_batch(waiting[:1], [], pool, BatchLimits(), 2.0) is None
    assert Fcfs().next_batch([], [], pool, BatchLimits(), 2.0) is None


def test_blocked_head_holds_later_prefills_but_decodes_run():
    pool = PoolView(5, 0, {"a": 16, "b": 16})
    waiting = [w("head", 0.0, "a", prompt=100), w("b1", 1.0, "b"), w("a2", 2.0, "a")]
    running = [d("b0", 0.5, "b")]
    # head needs 7 blocks > 5: it waits, later prefills (b1, a2) must not jump it; b's decode runs
    assert Fcfs().next_batch(waiting, running, pool, BatchLimits(), 3.0) == Batch("b", "decode", ("b0",))


def test_pool_admission_is_cumulative_and_stops_at_first_misfit():
    pool = PoolView(free_blocks=7, watermark_blocks=2, tokens_per_block={"a": 16})  # 5 available
    waiting = [
        w("r1", 1.0, prompt=31),
        w("r2", 2.0, prompt=31),
        w("r3", 3.0, prompt=15),
        w("r4", 4.0, prompt=1),
    ]
    # r1, r2 take 2 blocks each (prompt + 1 token = 32); r3 needs 1 -> 5 total; r4 would be the 6th
    b = Fcfs().next_batch(waiting, [], pool, BatchLimits(), 5.0)
    assert b.request_ids == ("r1", "r2", "r3")
    big_first = [w("r1", 1.0, prompt=31), w("r2", 2.0, prompt=100), w("r3", 3.0, prompt=1)]
    assert Fcfs().next_batch(big_first, [], pool, BatchLimits(), 5.0).request_ids == ("r1",)


def test_batch_limits():
    waiting = [w(f"r{i}", float(i), prompt=100) for i in range(6)]
    running = [d(f"d{i}", -1.0 + i / 10) for i in range(3)]
    lim = BatchLimits(max_requests=4, max_prefill_tokens=250)
    b = Fcfs().next_batch(waiting, running, BIG, lim, 9.0)
    assert b.request_ids == ("d0", "d1", "d2", "r0")
    b = Fcfs().next_batch(waiting, [], BIG, lim, 9.0)
    assert b.request_ids == ("r0", "r1")  # 200 tokens; a third would make 300 > 250
    long_prompt = [w("long", 0.0, prompt=1000), w("r", 1.0, prompt=10)]
    assert Fcfs().next_batch(long_prompt, [], BIG, lim, 9.0).request_ids == ("long",)  # alone
    full = [d(f"d{i}", i) for i in range(6)]
    assert Fcfs().next_batch(waiting, full, BIG, lim, 9.0).request_ids == ("d0", "d1", "d2", "d3")


def test_victim_is_most_recent_arrival():
    running = [d("x", 1.0), d("z", 3.0), d("y", 3.0), d("w", 2.0)]
    assert Fcfs().preemption_victim(running, 5.0).request_id == "z"
    with pytest.raises(ValueError):
        Fcfs().preemption_victim([], 5.0)


def test_inputs_not_mutated_and_iteration_bookkeeping():
    waiting, running = (w("p", 2.0),), [d("x", 1.0), d("other", 5.0, "b")]
    snapshot = (list(waiting), list(running))
    pol = Fcfs()
    b = pol.next_batch(waiting, running, BIG, BatchLimits(), 3.0)
    assert (list(waiting), running) == snapshot
    pol.on_iteration(b, 0.25, 3.25, [*waiting, *running])
    assert waiting[0].first_scheduled_s == 3.0 and waiting[0].last_run_s == 3.25
    assert running[1].first_scheduled_s is None  # not in the batch
    with pytest.raises(ValueError):
        pol.on_iteration(b, -1.0, 3.0, running)


@pytest.mark.parametrize("seed", range(20))
def test_decode_only_batches_follow_the_rule(seed):
    """With nothing waiting (FCFS's fast path): the oldest running request's model, all its decodes in
    arrival order (ties by id), at most max_requests."""
    import random

    rng = random.Random(seed)
    running = [
        d(f"r{i}", rng.choice([0.5, 1.0, 1.5, rng.random()]), rng.choice("ab"))
        for i in range(rng.randint(1, 12))
    ]
    rng.shuffle(running)
    limits = BatchLimits(max_requests=rng.randint(1, 8))
    order = sorted(running, key=lambda r: (r.arrival_s, r.request_id))
    model = order[0].model
    want = tuple(r.request_id for r in order if r.model == model)[: limits.max_requests]
    assert Fcfs().next_batch([], running, BIG, limits, 3.0) == Batch(model, "decode", want)


# --------------------------------------------------------------------------- single_phase (vLLM 0.2–0.4)
def sp():
    return Fcfs(FcfsOptions(single_phase=True))


def test_single_phase_option_is_validated_and_defaults_off():
    assert Fcfs().single_phase is False and sp().single_phase is True
    with pytest.raises(ValueError, match="single_phase"):
        # a wrong type on purpose: the check under test
        FcfsOptions(single_phase="yes")  # type: ignore[arg-type]
    assert make_request_policy("fcfs", single_phase=True).single_phase is True  # policy options path
    with pytest.raises(ValueError, match=r"bad options for request policy 'fcfs'.*single_phse"):
        make_request_policy("fcfs", single_phse=True)


def test_single_phase_prefill_first_never_mixed():
    # mixed FCFS would run ("x", "p") together; vLLM 0.2-0.4 runs the admissible prompt alone first
    assert sp().next_batch([w("p", 2.0)], [d("x", 1.0)], BIG, BatchLimits(), 3.0) == Batch(
        "a", "prefill", ("p",)
    )
    # nothing waiting: all decodes, as before
    assert sp().next_batch([], [d("y", 1.5), d("x", 1.0)], BIG, BatchLimits(), 3.0) == Batch(
        "a", "decode", ("x", "y")
    )


def test_single_phase_decodes_when_no_prefill_is_admissible():
    pool = PoolView(5, 0, {"a": 16, "b": 16})
    # the head (7 blocks > 5) blocks every later prompt; the running decode goes on
    waiting = [w("head", 0.0, "a", prompt=100), w("a2", 2.0, "a")]
    assert sp().next_batch(waiting, [d("a0", -1.0)], pool, BatchLimits(), 3.0) == Batch(
        "a", "decode", ("a0",)
    )


def test_single_phase_running_plus_admitted_within_max_requests():
    lim = BatchLimits(max_requests=4)
    waiting = [w(f"r{i}", float(i)) for i in range(6)]
    running = [d(f"d{i}", -1.0 + i / 10) for i in range(3)]
    # vLLM admits a prompt only while running + new <= max_num_seqs: one slot left
    assert sp().next_batch(waiting, running, BIG, lim, 9.0) == Batch("a", "prefill", ("r0",))
    full = [d(f"d{i}", -1.0 + i / 10) for i in range(4)]
    assert sp().next_batch(waiting, full, BIG, lim, 9.0) == Batch("a", "decode", ("d0", "d1", "d2", "d3"))
    # the prefill token budget still applies; a longer prompt runs alone
    lim2 = BatchLimits(max_requests=8, max_prefill_tokens=40)
    assert sp().next_batch(waiting, [], BIG, lim2, 9.0).request_ids == ("r0", "r1")


def test_single_phase_keeps_the_model_order():
    waiting = [w("a1", 1.0, "a"), w("b1", 0.5, "b")]
    running = [d("a0", 0.9, "a")]
    assert sp().next_batch(waiting, running, BIG, BatchLimits(), 3.0) == Batch("b", "prefill", ("b1",))
    assert sp().next_batch(waiting[:1], running, BIG, BatchLimits(), 3.0) == Batch("a", "prefill", ("a1",))


@pytest.mark.parametrize("seed", range(20))
def test_single_phase_batches_are_one_phase_and_prefill_first(seed):
    """Random queues: every batch is all prefills or all decodes; a decode batch is returned only when
    the mixed policy would have admitted no prefill for that model."""
    import random

    rng = random.Random(seed)
    models = "ab"
    waiting = [
        w(f"w{i}", rng.random() * 4, rng.choice(models), prompt=rng.randint(1, 200))
        for i in range(rng.randint(0, 8))
    ]
    running = [d(f"r{i}", rng.random() * 4, rng.choice(models)) for i in range(rng.randint(0, 8))]
    pool = PoolView(rng.randint(0, 40), rng.randint(0, 3), {"a": 16, "b": 16})
    limits = BatchLimits(max_requests=rng.randint(1, 8), max_prefill_tokens=rng.randint(50, 400))
    b = sp().next_batch(waiting, running, pool, limits, 5.0)
    mixed = Fcfs().next_batch(waiting, running, pool, limits, 5.0)
    if b is None:
        assert mixed is None
        return
    ids = set(b.request_ids)
    if b.phase == "prefill":
        assert ids <= {r.request_id for r in waiting}
    else:
        assert b.phase == "decode" and ids <= {r.request_id for r in running}
        if mixed is not None and mixed.model == b.model:
            assert set(mixed.request_ids) <= {r.request_id for r in running}


def test_single_phase_reaches_the_live_engine_through_its_options():
    """Live: ``llmfleet-engine --policy fcfs --policy-options '{"single_phase": true}'`` (or a cluster
    config's ``options``) builds the same policy object."""
    import json

    from llmfleet.policies.engine_policy import make_engine_policy
    from llmfleet.spec.engines import EngineConfig

    assert make_engine_policy("fcfs", single_phase=True).single_phase is True
    args = EngineConfig(models=["m"], policy="fcfs", options={"single_phase": True}).engine_args()
    assert json.loads(args[args.index("--policy-options") + 1]) == {"single_phase": True}
