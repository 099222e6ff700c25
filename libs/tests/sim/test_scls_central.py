"""SCLS central scheduling in the simulator (llmfleet.sim.scls_central): the pool, the DP per tick, max-min
offloading, the interval rule, slice-end returns (recompute vs keep), memory.

Engine costs are the conftest's hand formulas (prefill 0.1 + 0.001·T + 1e-6·Q, decode 0.01 + 0.001·b +
1e-4·S); the scheduler's estimator is the hand slice cost below, T_serve(n, L, S) = 1 + 0.01·n·L
(S-independent), so the DP's optimum is computable by hand.
"""

from __future__ import annotations

import random

import pytest
from llmfleet.policies.batching.scls_dp import dp_batches
from llmfleet.policies.central import SclsCentralOptions
from llmfleet.policies.placement import InstancePlan
from llmfleet.sim.run import PolicyBundle, simulate
from llmfleet.sim.scls_central import SclsCentral, kept_key, make_central
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.workload import Workload
from llmfleet.workload import WorkloadRequest as W

approx = pytest.approx
S = 8


class HandSlice:
    """T_serve(n, L, S) = 1 + 0.01·n·L (works elementwise on numpy arrays too)."""

    def t_serve(self, n, l_in, s):
        return 1.0 + 0.01 * n * l_in


def central_sim(tiny, *, instances=1, slice_end="recompute", engine=None, lam=0.5, gamma_s=1.0, **kw):
    central = SclsCentral(
        SclsCentralOptions(
            cost=HandSlice(), slice_iterations=S, lam=lam, gamma_s=gamma_s, slice_end=slice_end, **kw
        )
    )
    finishes: list[str] = []
    inner = central.maxmin.on_finish

    def count(rid, iid, out, now):
        finishes.append(rid)
        inner(rid, iid, out, now)

    central.maxmin.on_finish = count  # the simulator tells the dispatch policy of each finish
    sim = tiny.sim(
        make_policy=central.make_feed,
        instances=instances,
        dispatch=central.maxmin,
        engine=engine or EngineSettings(static_release="batch_end"),
        sample_period_s=0.05,
    )
    central.install(sim)
    return sim, central, finishes


def by_id(res):
    return {r.request_id: r for r in res.records}


def check_all_done_once(res, finishes):
    recs = by_id(res)
    assert all(r.done and not r.failed for r in recs.values())
    assert all(r.produced == r.output_tokens for r in recs.values())
    assert sorted(finishes) == sorted(recs)  # every request finished exactly once


def test_dp_over_the_pool_and_maxmin_order(tiny):
    # four requests in the pool at the first tick: lengths 10, 10, 500, 500. One batch costs
    # 1 + 0.01·4·500 = 21 s; {10,10} + {500,500} costs (1 + 0.2) + (1 + 10) = 12.2 s: the DP splits.
    work = [
        W("a", 0.0, 500, 2, "s"),
        W("b", 0.0, 10, 2, "s"),
        W("c", 0.0, 500, 2, "s"),
        W("d", 0.0, 10, 2, "s"),
    ]
    sim, central, finishes = central_sim(tiny, instances=2)
    res = sim.run(work)
    check_all_done_once(res, finishes)
    first = [(b.request_ids, b.estimate_s, w) for t, b, w in central.assignments if t == 0.0]
    # max-min: the longest estimate (11 s) first to i0, then 1.2 s to the least-loaded i1
    assert first == [(("a", "c"), approx(11.0), "i0"), (("b", "d"), approx(1.2), "i1")]
    # the same partition as Algorithm 1 on the pool's input lengths
    groups = dp_batches([500, 10, 500, 10], lambda n, ln: 1 + 0.01 * n * ln, lambda n, ln: True)
    assert sorted(tuple("abcd"[k] for k in g) for g in groups) == [("a", "c"), ("b", "d")]
    assert by_id(res)["a"].instance == "i0" and by_id(res)["b"].instance == "i1"


def test_maxmin_three_batches_two_workers(tiny):
    # lengths chosen so the DP keeps three batches (10 | 300 | 900): estimates 1.1, 4.0 (2 rows of 150?),
    # here one row each: 1 + 0.01·L → 10.0 (900), 4.0 (300), 1.1 (10); merging any two costs more.
    work = [W("x", 0.0, 10, 1, "s"), W("y", 0.0, 300, 1, "s"), W("z", 0.0, 900, 1, "s")]
    sim, central, finishes = central_sim(tiny, instances=2)
    res = sim.run(work)
    check_all_done_once(res, finishes)
    got = [(b.request_ids, w) for t, b, w in central.assignments]
    # descending estimate: z (10) → i0; y (4) → i1 (load 0); x (1.1) → i1 (load 4 < 10)
    assert got == [(("z",), "i0"), (("y",), "i1"), (("x",), "i1")]


def test_interval_rule(tiny):
    # p (900) and q (10) are two batches (19 s together vs 10 + 1.1 s apart): loads 10 (i0) and 1.1 (i1)
    # after the first offload, so T = max(λ·min load, Γ) = max(0.5·1.1, 0.5) = 0.55 s
    work = [W("p", 0.0, 900, 1, "s"), W("q", 0.0, 10, 1, "s"), W("late", 0.3, 10, 1, "s")]
    sim, central, finishes = central_sim(tiny, instances=2, gamma_s=0.5)
    res = sim.run(work)
    check_all_done_once(res, finishes)
    assert [(b.request_ids, w) for t, b, w in central.assignments if t == 0.0] == [
        (("p",), "i0"),
        (("q",), "i1"),
    ]
    (t0, first), (t1, _) = central.stats.intervals[:2]
    assert (t0, first) == (0.0, approx(0.55))
    assert t1 == approx(0.55)
    # the late arrival waited in the pool for that tick (no dispatch at arrival), then went to the
    # least-loaded worker: i1 finished q (its load back to 0) while i0 still carries p's 10 s
    assert central.assignments[-1][1].request_ids == ("late",) and central.assignments[-1][2] == "i1"
    assert central.assignments[-1][0] == approx(0.55)
    assert by_id(res)["late"].first_token_s > t1


def test_interval_gamma_floor(tiny):
    work = [W("a", 0.0, 10, 1, "s")]
    sim, central, _ = central_sim(tiny, instances=1, gamma_s=3.0)
    sim.run(work)
    # load 1.1 s → λ·1.1 = 0.55 < Γ = 3
    assert central.stats.intervals[0] == (0.0, approx(3.0))


def test_slice_end_returns_to_pool_and_is_rescheduled(tiny):
    # r needs 2·S + 3 tokens: three slices, two returns to the pool; n arrives meanwhile and is
    # batched with r's second slice (both in the pool at the same tick)
    work = [W("r", 0.0, 20, 2 * S + 3, "s"), W("n", 0.3, 20, 4, "s")]
    sim, central, finishes = central_sim(tiny, instances=1)
    res = sim.run(work)
    check_all_done_once(res, finishes)
    recs = by_id(res)
    assert recs["r"].requeues == 2 and recs["n"].requeues == 0
    assert central.stats.returns == 2
    batches = [b.request_ids for _, b, _ in central.assignments]
    assert batches[0] == ("r",)
    # the returned r (input 20 + 8 = 28) and the new n (20) are one batch at the second tick
    assert set(batches[1]) == {"r", "n"}
    assert central.assignments[1][1].padded_len == 20 + S
    assert batches[2] == ("r",)
    # the second tick came after r's first slice ended (it waited in the pool)
    assert central.assignments[1][0] > 0.0
    assert res.instances[0]["requeues"] == 2
    # r's first slice ran all S iterations (not an early return); the other two batches ended early
    assert res.instances[0]["static_batches"] == 3
    # batch 1 (r alone) and batch 2 ({r, n}: r still has tokens left) end at the slice limit; batch 3 (r's
    # last 3 tokens, every row done before S) is an early return
    assert res.instances[0]["early_returns"] == 1


def test_keep_skips_the_reprefill_on_the_same_instance(tiny):
    # one instance: the returned request is re-batched onto it. Keep mode's second slice starts with a
    # decode step instead of the prefill of prompt + S tokens; ticks are the same in both modes.
    work = [W("r", 0.0, 200, S + 4, "s")]
    out = {}
    for mode in ("recompute", "keep"):
        sim, central, finishes = central_sim(tiny, instances=1, slice_end=mode)
        res = sim.run(work)
        check_all_done_once(res, finishes)
        out[mode] = (by_id(res)["r"], central, sim)
    rec_r, c_r, _ = out["recompute"]
    rec_k, c_k, sim_k = out["keep"]
    assert [t for t, *_ in c_r.assignments] == [t for t, *_ in c_k.assignments]
    ctx = 200 + S
    saved = tiny.pre(ctx, ctx * ctx) - tiny.dec(1, ctx)
    assert rec_r.finish_s - rec_k.finish_s == approx(saved, abs=1e-9)
    assert c_k.stats.keep_hits == 1 and c_r.stats.keep_hits == 0
    # while r waited in the pool its KV (prompt + S tokens) stayed reserved; all freed at the end
    assert sim_k.instances["i0"].alloc.used_blocks == 0
    assert not c_k.kept


@pytest.mark.parametrize("mode", ["recompute", "keep"])
def test_kv_while_in_the_pool(tiny, mode):
    # r's first slice ends well before the second tick at Γ = 2 s: probe in between. Recompute freed its
    # KV with the batch; keep holds prompt + S tokens for it (and nothing else is allocated).
    work = [W("r", 0.0, 200, S + 4, "s")]
    sim, central, _ = central_sim(tiny, instances=1, slice_end=mode, gamma_s=2.0)
    seen = []

    def probe(s, now):
        alloc = s.instances["i0"].alloc
        held = alloc.num_tokens(kept_key("r")) if kept_key("r") in alloc else 0
        seen.append((now, "r" in central.pool, held, alloc.used_blocks))

    sim.at(1.5, probe)
    sim.run(work)
    blocks = -(-(200 + S) // tiny.block_tokens)
    assert seen == ([(1.5, True, 200 + S, blocks)] if mode == "keep" else [(1.5, True, 0, 0)])


def test_keep_elsewhere_frees_the_old_copy(tiny):
    # two workers, many multi-slice requests: returned rows land on their KV's worker (hit) or the other
    # one (miss: the old copy is freed at the offload); every kept copy is accounted for and freed.
    rng = random.Random(3)
    work = sorted(
        [W(f"q{i}", rng.uniform(0, 2), rng.randint(10, 400), rng.randint(1, 4 * S), "s") for i in range(30)],
        key=lambda w: w.arrival_s,
    )
    sim, central, finishes = central_sim(tiny, instances=2, slice_end="keep")
    res = sim.run(work)
    check_all_done_once(res, finishes)
    st = central.stats
    # every returned row that kept its KV was later re-batched: onto its worker (hit) or elsewhere (miss)
    assert st.keep_hits + st.keep_misses + st.kept_evicted + st.kept_dropped == st.returns
    assert st.keep_hits > 0 and st.keep_misses > 0
    assert all(i.alloc.used_blocks == 0 for i in sim.instances.values())
    assert not central.kept


@pytest.mark.parametrize("mode", ["recompute", "keep"])
def test_memory_bound_and_exactly_once(tiny, mode):
    # a pool of 64 blocks (16 tokens each): the DP may not put more than ⌊0.9·(64 − wm)⌋ padded blocks in a
    # batch; the allocator raises on any overflow, and the samples never exceed the pool
    blocks = 64
    eng = EngineSettings(static_release="batch_end", kv_bytes=blocks * tiny.block_bytes, watermark=0.0)
    rng = random.Random(7)
    t = 0.0
    work = []
    for i in range(60):
        t += rng.expovariate(20.0)
        work.append(W(f"r{i}", t, rng.randint(5, 120), rng.randint(1, 3 * S), "s"))
    sim, central, finishes = central_sim(tiny, instances=2, slice_end=mode, engine=eng)
    res = sim.run(work)
    check_all_done_once(res, finishes)
    budget = int(0.9 * blocks)
    for _, b, _ in central.assignments:
        assert len(b.request_ids) * -(-(b.padded_len + S) // 16) <= budget or len(b.request_ids) == 1
    assert any(len(b.request_ids) > 1 for _, b, _ in central.assignments)
    assert all(s.kv_used <= s.kv_capacity for s in res.samples)
    assert max(s.kv_used for s in res.samples) > 0
    recs = by_id(res)
    assert sum(r.requeues for r in recs.values()) == central.stats.returns
    assert all(r.requeues == -(-r.output_tokens // S) - 1 for r in recs.values())  # one per extra slice
    if mode == "keep":
        assert central.stats.kept_evicted + central.stats.keep_hits > 0
    assert all(i.alloc.used_blocks == 0 for i in sim.instances.values())


def test_no_prefill_token_cap_unless_asked(tiny):
    # 8 rows of 300 tokens: 2,400 padded prefill tokens > max_prefill_tokens = 1,000. The paper bounds memory
    # only: one batch. With the cap as an option the DP splits into runs of ≤ 3 rows.
    work = [W(f"r{i}", 0.0, 300, 1, "s") for i in range(8)]
    eng = EngineSettings(static_release="batch_end", max_prefill_tokens=1000)
    sim, central, finishes = central_sim(tiny, instances=1, engine=eng)
    check_all_done_once(sim.run(work), finishes)
    assert [len(b.request_ids) for _, b, _ in central.assignments] == [8]
    sim, central, finishes = central_sim(tiny, instances=1, engine=eng, max_prefill_tokens=1000)
    check_all_done_once(sim.run(work), finishes)
    sizes = [len(b.request_ids) for _, b, _ in central.assignments]
    assert sum(sizes) == 8 and max(sizes) <= 3


def test_early_return_counted(tiny):
    # outputs ≤ S: every batch ends before its slice limit with all rows done (early return)
    work = [W("a", 0.0, 10, 2, "s"), W("b", 0.0, 10, 3, "s")]
    sim, _, finishes = central_sim(tiny, instances=1)
    res = sim.run(work)
    check_all_done_once(res, finishes)
    assert res.instances[0]["static_batches"] == 1 and res.instances[0]["early_returns"] == 1


def test_simulate_bundle_and_report(tiny):
    spec = SimSpec(
        ClusterSpec.parse("2xA100-80GB"),
        (SimService("s", tiny.model, max_tokens=64),),
        EngineSettings(static_release="batch_end"),
    )
    rng = random.Random(1)
    t, reqs = 0.0, []
    for i in range(40):
        t += rng.expovariate(5.0)
        reqs.append(W(f"r{i}", t, rng.randint(10, 300), rng.randint(1, 40), "s"))
    plan = [InstancePlan(f"g{i}", (tiny.model,), 1) for i in range(2)]
    reports = {}
    for mode in ("recompute", "keep"):
        bundle = PolicyBundle(
            f"scls-central-{mode}",
            dispatch={
                "policy": "scls_central",
                "options": {"slice_iterations": 16, "slice_end": mode, "gamma_s": 1.0},
            },
        )
        e = simulate(spec, Workload(tuple(reqs)), bundle, plan=plan, samples=20)
        rep = e.report
        assert rep["overall"]["completed"] == 40 and rep["overall"]["failed"] == 0
        assert rep["scls_central"]["slice_end"] == mode
        assert rep["scls_central"]["batches"] == rep["scls_central"]["batches_done"]
        assert 0.0 <= rep["cluster"]["early_return_fraction"] <= 1.0
        assert rep["cluster"]["static_batches"] == rep["scls_central"]["batches"]
        assert rep["overall"]["reschedules"]["n"] == 40
        reports[mode] = rep
    assert reports["keep"]["scls_central"]["keep_hits"] > 0
    with pytest.raises(ValueError, match="slice_end"):
        simulate(spec, Workload(tuple(reqs)), PolicyBundle("x", dispatch={"policy": "scls_central",
                 "options": {"slice_end": "bogus"}}), plan=plan)  # fmt: skip
    with pytest.raises(ValueError, match="fixed plan"):
        PolicyBundle("x", {"interval_s": 10.0}, dispatch="scls_central").validate()


def test_assign_batches_credit_prefers_the_kv_holder():
    from llmfleet.policies.dispatch.scls_maxmin import SclsMaxMin, SclsMaxMinOptions

    mm = SclsMaxMin(SclsMaxMinOptions(HandSlice(), slice_iterations=S))
    mm.loads = {"w0": 2.0, "w1": 0.5}
    # without credit: least load (w1); a credit of 2 s on w0 makes w0 the smaller load − credit (0 < 0.5)
    assert mm.assign_batches([("b", 1.0)], ["w0", "w1"]) == [("b", "w1")]
    mm.loads = {"w0": 2.0, "w1": 0.5}
    assert mm.assign_batches([("b", 1.0)], ["w0", "w1"], credit=lambda b, w: 2.0 if w == "w0" else 0.0) == [
        ("b", "w0")
    ]
    assert mm.load("w0") == approx(3.0)  # the full estimate is booked
    mm.loads = {"w0": 2.0, "w1": 0.5}
    assert mm.assign_batches([("b", 1.0)], ["w0", "w1"], credit=lambda b, w: 1.0 if w == "w0" else 0.0) == [
        ("b", "w1")
    ]


def test_keep_affinity_raises_the_hit_rate(tiny):
    rng = random.Random(3)
    work = sorted(
        [W(f"q{i}", rng.uniform(0, 2), rng.randint(10, 400), rng.randint(1, 4 * S), "s") for i in range(30)],
        key=lambda w: w.arrival_s,
    )
    hits = {}
    for aff in (False, True):
        sim, central, finishes = central_sim(tiny, instances=2, slice_end="keep", keep_affinity=aff)
        check_all_done_once(sim.run(work), finishes)
        st = central.stats
        assert st.keep_hits + st.keep_misses + st.kept_evicted + st.kept_dropped == st.returns
        hits[aff] = (st.keep_hits, st.keep_misses)
    assert hits[True][0] > hits[False][0] and hits[True][1] < hits[False][1]
    with pytest.raises(ValueError, match="keep_affinity"):
        SclsCentralOptions(cost=HandSlice(), keep_affinity=True, slice_end="recompute")
    with pytest.raises(ValueError, match=r"bad options for central policy 'scls_central'.*keep_afinity"):
        make_central("scls_central", {"keep_afinity": True})
    with pytest.raises(ValueError, match=r"unknown central policy 'scls'"):
        make_central("scls", {})


def test_worker_queue_serves_the_offloaded_batches_in_order():
    from llmfleet.policies.batching.base import StaticBatch
    from llmfleet.policies.batching.scls_dp import SclsWorkerQueue
    from llmfleet.policies.request.base import BatchLimits, PoolView, SchedRequest

    done = []
    q = SclsWorkerQueue(on_done=lambda b, now: done.append((b.request_ids, now)))
    pool = PoolView(100, 0, {"m": 16})
    lim = BatchLimits(256, 8192)

    def req(rid):
        return SchedRequest(rid, "s", "m", 0.0, 10, 5)

    assert q.form_batch([req("a")], pool, lim, 0.0) is None  # nothing offloaded: no batch of its own
    q.push(StaticBatch("m", ("a", "b"), S))
    q.push(StaticBatch("m", ("c",), S))
    assert q.form_batch([req("a"), req("c")], pool, lim, 0.0) is None  # the head waits for b
    first = q.form_batch([req("a"), req("b"), req("c")], pool, lim, 0.0)
    assert first == StaticBatch("m", ("a", "b"), S)
    assert q.form_batch([req("c")], pool, lim, 1.0) == StaticBatch("m", ("c",), S)
    q.on_batch_done(first, 1.0, 2.0, [])
    assert done == [(("a", "b"), 2.0)]
