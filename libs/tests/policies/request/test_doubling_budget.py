import gc
import random

import pytest
from llmfleet.policies.request import (
    Batch,
    BatchLimits,
    DoublingBudget,
    DoublingBudgetOptions,
    PoolView,
    SchedRequest,
    ServiceStats,
)
from llmfleet.policies.request.base import admit_prefills, fits_alone
from llmfleet.policies.request.solo_cost import SoloCost

BIG = PoolView(free_blocks=10_000, watermark_blocks=0, tokens_per_block={"ms": 16, "ml": 16, "m2": 16})


def w(rid, service="short", arrival=0.0, prompt=15, model=None):
    model = model or {"short": "ms", "long": "ml"}.get(service, "ms")
    return SchedRequest(rid, service, model, arrival, prompt, 8)


def d(rid, service="short", arrival=0.0, prompt=15, model=None):
    r = w(rid, service, arrival, prompt, model)
    r.phase, r.generated = "decode", 1
    return r


def policy(short=(0.1, 0.02), long=(1.0, 0.2), **kw):
    """DB whose service stats have exactly these (L̂, σ): two samples m ± σ/√2 per service (Algorithm 2
    as printed unless ``admission`` is given)."""
    kw.setdefault("admission", "literal")
    p = DoublingBudget(DoublingBudgetOptions(**kw))
    for svc, (mean, std) in (("short", short), ("long", long)):
        # two samples m ± s/√2 have mean m and sample std s
        p.observe(svc, mean - std / 2**0.5)
        p.observe(svc, mean + std / 2**0.5)
    return p


def arrive(p, *reqs, now=0.0):
    for r in reqs:
        p.on_arrival(r, now)
    return reqs


def test_budget_initialised_from_service_stats():
    p = policy()
    s, lg, unseen = arrive(p, w("s"), w("l", "long"), w("u", "new"))
    assert p.budget(s).left_s == pytest.approx(0.12) and p.budget(s).renewals == 0
    assert s.priority == pytest.approx(0.12 * 0.1)  # O_r = Q_r · L̂_s
    assert p.budget(lg).left_s == pytest.approx(1.2) and lg.priority == pytest.approx(1.2)
    assert p.budget(unseen).left_s == pytest.approx(1.0 + 0.5)  # default prior: mean 1.0, std 0.5
    p.budget(s).left_s = 0.05
    p.on_arrival(s, 1.0)  # idempotent: an initialised budget is kept
    assert p.budget(s).left_s == 0.05


def test_budgets_live_in_the_policy_table_and_go_with_their_request():
    p = policy()
    done, dropped = arrive(p, w("done"), w("dropped"))
    p.charge(done, 0.05)
    assert p.tracked == 2 and p.budget(done).left_s == pytest.approx(0.07)
    assert p.budget(w("done")).left_s == pytest.approx(0.12)  # another request object: a fresh budget
    gc.collect()
    p.on_finish(done, 1.0)
    assert p.tracked == 1
    del dropped  # cancelled: the engine lets the request go, and its budget goes with it
    gc.collect()
    assert p.tracked == 0


def test_charging_and_geometric_doubling_at_exact_boundaries():
    p = DoublingBudget(DoublingBudgetOptions(default_mean_s=1.0, default_std_s=0.0))  # L̂ + σ = 1
    (r,) = arrive(p, w("r", "svc"))
    b = Batch("ms", "prefill", ("r",))
    p.on_iteration(b, 0.25, 1.0, [r])
    assert (p.budget(r).left_s, p.budget(r).renewals) == (0.75, 0)
    p.on_iteration(b, 0.75, 2.0, [r])  # Q = 0 -> first renewal: 2^1 (L̂ + σ)
    assert (p.budget(r).left_s, p.budget(r).renewals, r.priority) == (2.0, 1, 2.0)
    for k in (2, 3, 4):
        p.on_iteration(b, p.budget(r).left_s, 3.0, [r])  # use the whole budget exactly
        assert (p.budget(r).left_s, p.budget(r).renewals) == (2.0**k, k)
        assert r.priority == 2.0**k * 1.0  # priority recomputed: Q_r · L̂_s


def test_renewal_resets_to_q_prime_as_the_paper_states():
    """§4.2: a used-up budget is doubled, Q′ = 2(L̂_s + σ_s), and the priority reset to Q′·L̂_s: the
    overshoot past the old budget is not taken off."""
    p = DoublingBudget(
        DoublingBudgetOptions(default_mean_s=1.0, default_std_s=0.0)
    )  # the default renewal is "reset"
    assert p.renewal == "reset"
    one, many, big = arrive(p, w("one", "svc"), w("many", "svc"), w("big", "svc"))
    p.charge(one, 1.5)  # 1 - 1.5 = -0.5 -> reset to 2^1 = 2 (carry would give 1.5)
    assert (p.budget(one).left_s, p.budget(one).renewals, one.priority) == (2.0, 1, 2.0)
    for _ in range(6):  # 4 × 0.25 use the first budget up exactly, the next 2 come off Q′ = 2
        p.charge(many, 0.25)
    assert (p.budget(many).left_s, p.budget(many).renewals) == (1.5, 1)
    p.charge(big, 10.0)  # one long iteration renews once: Q′ = 2, not the carried 1+2+4+8 − 10
    assert (p.budget(big).left_s, p.budget(big).renewals) == (2.0, 1)
    p.charge(big, 2.5)  # the second renewal: 2^2
    assert (p.budget(big).left_s, p.budget(big).renewals) == (4.0, 2)


def test_carry_variant_takes_the_overshoot_off_independent_of_granularity():
    p = DoublingBudget(DoublingBudgetOptions(default_mean_s=1.0, default_std_s=0.0, renewal="carry"))
    one, many, big = arrive(p, w("one", "svc"), w("many", "svc"), w("big", "svc"))
    p.charge(one, 1.5)  # 1 - 1.5 = -0.5 -> + 2 = 1.5
    assert (p.budget(one).left_s, p.budget(one).renewals) == (1.5, 1)
    for _ in range(15):
        p.charge(many, 0.1)
    assert p.budget(many).left_s == pytest.approx(1.5) and p.budget(many).renewals == 1
    p.charge(big, 10.0)  # one long iteration exhausts several budgets: granted 1+2+4+8 = 15
    assert (p.budget(big).left_s, p.budget(big).renewals) == (5.0, 3)
    with pytest.raises(ValueError, match="renewal"):
        DoublingBudget(DoublingBudgetOptions(renewal="nope"))


def test_reset_and_carry_order_requests_differently():
    """A case where the two renewals disagree on who runs next: after one long iteration, reset gives the
    long-running request a full Q′ (it goes last), carry leaves it nearly out of budget (it goes first)."""
    picks = {}
    for renewal in ("reset", "carry"):
        p = DoublingBudget(DoublingBudgetOptions(default_mean_s=1.0, default_std_s=0.0, renewal=renewal))
        ran, fresh = arrive(p, d("ran", "svc"), d("fresh", "svc", arrival=1.0))
        p.on_iteration(Batch("ms", "decode", ("ran",)), 2.9, 3.0, [ran])  # 1 − 2.9 → reset 2 / carry 0.1
        picks[renewal] = p.next_batch((), (ran, fresh), BIG, BatchLimits(max_requests=1), 3.0).request_ids
        assert p.budget(ran).renewals == 1
    assert picks == {"reset": ("fresh",), "carry": ("ran",)}


def test_shorter_service_first_when_budgets_equal_c_mu():
    p = policy(short=(0.1, 0.0), long=(1.0, 0.0))
    s, lg = arrive(p, w("s", "short", arrival=5.0), w("l", "long", arrival=1.0))
    p.budget(s).left_s = p.budget(lg).left_s = 0.5
    assert p.next_batch([lg, s], [], BIG, BatchLimits(), 6.0) == Batch("ms", "prefill", ("s",))
    assert s.priority == pytest.approx(0.05) and lg.priority == pytest.approx(0.5)


def test_priority_order_short_before_long_and_nearly_done_first():
    p = policy(starvation_factor=None)
    ls = arrive(p, w("l", "long"))
    ss = arrive(p, w("s1", "short", 1.0), w("s2", "short", 2.0))
    assert p.next_batch([*ls, *ss], [], BIG, BatchLimits(), 3.0).request_ids == ("s1", "s2")
    dl = d("dl", "long")  # a long decode that used most of its budget beats fresh short prefills
    arrive(p, dl)
    p.charge(dl, 1.199)
    assert p.next_batch(list(ss), [dl], BIG, BatchLimits(), 3.0) == Batch("ml", "decode", ("dl",))
    s3 = d("s3", "short", 2.5)  # within a service, more budget used = higher priority (SRPT-like)
    arrive(p, s3)
    p.charge(s3, 0.05)
    b = p.next_batch([], [dl, d("s4", "short", 0.0), s3], BIG, BatchLimits(), 3.0)
    assert b.request_ids[0] == "dl" and b.phase == "decode"


def test_one_service_one_phase_one_model_per_batch():
    p = policy()
    waiting = [w("sw1"), w("sw2"), w("lw", "long"), w("sx", model="m2")]
    running = [d("sd1", arrival=1.0), d("ld", "long")]
    arrive(p, *waiting, *running)
    p.budget(running[0]).left_s = 0.001  # the short decode is the top request
    b = p.next_batch(waiting, running, BIG, BatchLimits(), 1.0)
    assert b == Batch("ms", "decode", ("sd1",))
    # now fresh short prefills lead; sx is the same service on another model
    p.budget(running[0]).left_s = 0.2
    b = p.next_batch(waiting, running, BIG, BatchLimits(), 1.0)
    assert b == Batch("ms", "prefill", ("sw1", "sw2"))


def test_fill_respects_limits_and_pool_without_over_admission():
    p = policy()
    waiting = [w(f"s{i}", arrival=float(i), prompt=31) for i in range(6)]  # 2 blocks each
    arrive(p, *waiting)
    pool = PoolView(free_blocks=9, watermark_blocks=2, tokens_per_block={"ms": 16})  # 7 available
    assert p.next_batch(waiting, [], pool, BatchLimits(), 9.0).request_ids == ("s0", "s1", "s2")
    assert p.next_batch(waiting, [], BIG, BatchLimits(max_requests=2), 9.0).request_ids == ("s0", "s1")
    lim = BatchLimits(max_prefill_tokens=70)
    assert p.next_batch(waiting, [], BIG, lim, 9.0).request_ids == ("s0", "s1")
    decodes = [d(f"d{i}", arrival=float(i)) for i in range(5)]
    arrive(p, *decodes)
    for r in decodes:
        p.budget(r).left_s = 0.01
    assert p.next_batch([], decodes, pool, BatchLimits(max_requests=3), 9.0).request_ids == ("d0", "d1", "d2")


def test_prefill_seed_that_does_not_fit_falls_back():
    p = policy()
    huge = w("huge", prompt=1000)
    small = w("small", "long", arrival=1.0)
    dec = d("dec", "long", arrival=0.5)
    arrive(p, huge, small, dec)
    pool = PoolView(free_blocks=10, watermark_blocks=0, tokens_per_block={"ms": 16, "ml": 16})
    # huge is the top request but does not fit: run the best decode, admit no later prefill
    assert p.next_batch([huge, small], [dec], pool, BatchLimits(), 2.0) == Batch("ml", "decode", ("dec",))
    # nothing running: the next prefill that fits
    assert p.next_batch([huge, small], [], pool, BatchLimits(), 2.0) == Batch("ml", "prefill", ("small",))
    assert p.next_batch([huge], [], pool, BatchLimits(), 2.0) is None
    assert p.next_batch([], [], pool, BatchLimits(), 2.0) is None


def test_starvation_threshold_promotes_a_long_waiting_service():
    p = policy(starvation_factor=10.0)  # threshold 10 × L̂_s: 10 s for "long", 1 s for "short"
    lw = w("lw", "long", arrival=0.0)
    fresh = [w(f"s{i}", arrival=10.0 + i / 10) for i in range(3)]
    arrive(p, lw, *fresh)
    assert p.next_batch([lw, *fresh], [], BIG, BatchLimits(), 9.9).request_ids[0] == "s0"
    assert p.starving_services([lw, *fresh], [], 10.5) == [("long", lw)]
    assert p.next_batch([lw, *fresh], [], BIG, BatchLimits(), 10.5) == Batch("ml", "prefill", ("lw",))
    # a decode that has not run for longer than the threshold starves too
    ld = d("ld", "long", arrival=0.0)
    arrive(p, ld)
    p.on_iteration(Batch("ml", "decode", ("ld",)), 0.1, 20.0, [ld])
    fresh = [w(f"t{i}", arrival=29.6 + i / 10) for i in range(3)]
    arrive(p, *fresh)
    assert p.next_batch(fresh, [ld], BIG, BatchLimits(), 29.9).request_ids[0] == "t0"
    assert p.starving_services(fresh, [ld], 30.5) == [("long", ld)]
    assert p.next_batch(fresh, [ld], BIG, BatchLimits(), 30.5) == Batch("ml", "decode", ("ld",))


def test_starvation_order_config_and_disable():
    p = policy(starvation_threshold_s={"short": 100.0, "long": 5.0})
    old_l, old_s = w("l", "long", arrival=3.0), w("s", "short", arrival=0.0)
    arrive(p, old_l, old_s)
    # configured per service; else the default 100 × L̂_s (100 × the 1 s prior for an unseen service)
    assert p.starvation_threshold("long") == 5.0 and p.starvation_threshold("x") == 100.0
    assert policy().starvation_threshold("long") == pytest.approx(100.0)  # 100 × L̂ = 100 × 1 s
    assert policy().starvation_threshold("short") == pytest.approx(10.0)  # 100 × 0.1 s
    assert p.starving_services([old_l, old_s], [], 10.0) == [("long", old_l)]  # short's threshold: 100 s
    both = policy(starvation_factor=1.0)  # thresholds 0.1 s and 1 s: both starve, longest wait first
    arrive(both, old_l, old_s)
    assert [s for s, _ in both.starving_services([old_l, old_s], [], 10.0)] == ["short", "long"]
    off = policy(starvation_factor=None)
    assert off.starving_services([old_l, old_s], [], 1e9) == []
    with pytest.raises(ValueError):
        DoublingBudget(DoublingBudgetOptions(starvation_factor=0.0))
    with pytest.raises(ValueError):
        DoublingBudget(DoublingBudgetOptions(starvation_threshold_s={"x": -1.0}))


def test_victim_is_least_urgent():
    p = policy()
    running = [d("s", "short"), d("l1", "long", arrival=1.0), d("l2", "long", arrival=2.0)]
    arrive(p, *running)
    assert p.preemption_victim(running, 3.0).request_id == "l2"  # equal O_r: the later arrival
    p.charge(running[2], 1.0)
    assert p.preemption_victim(running, 3.0).request_id == "l1"
    with pytest.raises(ValueError):
        p.preemption_victim([], 0.0)


def test_deterministic_ties_by_arrival_then_id():
    def build():
        p = policy()
        reqs = [w("b", arrival=1.0), w("a", arrival=1.0), w("c", arrival=0.5), w("z", arrival=2.0)]
        arrive(p, *reqs)
        return p, reqs

    p, reqs = build()
    first = p.next_batch(reqs, [], BIG, BatchLimits(), 3.0)
    assert first.request_ids == ("c", "a", "b", "z")
    for seed in range(5):
        p2, reqs2 = build()
        random.Random(seed).shuffle(reqs2)
        assert p2.next_batch(tuple(reqs2), (), BIG, BatchLimits(), 3.0) == first
    assert p.next_batch(reqs, [], BIG, BatchLimits(), 3.0) == first  # calling again changes nothing


def test_inputs_untouched_lazy_init_and_finish_statistics():
    p = policy()
    waiting, running = (w("s"),), (d("x", "long"),)  # never announced via on_arrival
    b = p.next_batch(waiting, running, BIG, BatchLimits(), 1.0)
    assert p.budget(waiting[0]).left_s == pytest.approx(0.12)
    assert p.budget(running[0]).left_s == pytest.approx(1.2)
    assert b == Batch("ms", "prefill", ("s",)) and len(waiting) == 1 and len(running) == 1
    p.on_iteration(b, 0.5, 1.5, [*waiting, *running])  # only batch members are charged
    assert waiting[0].first_scheduled_s == 1.0 and p.budget(running[0]).left_s == pytest.approx(1.2)
    stats = ServiceStats(default_mean_s=1.0, default_std_s=0.0)
    q = DoublingBudget(stats=stats)
    q.on_finish(waiting[0], 3.0)  # execution time = its iterations' durations (0.5), not now - start (2.0)
    q.on_finish(w("never", arrival=2.4), 3.0)  # never scheduled: now - arrival
    assert stats.count("short") == 2 and stats.mean("short") == pytest.approx((0.5 + 0.6) / 2)


# ------------------------------------------------------------------ L̂_s from the single-request time (Eq. 7)


class Solo:
    """SoloCost stub: 0.01 s per prompt token + 0.1 s per output token; unknown models raise KeyError."""

    def solo_time(self, model, prompt_tokens, output_tokens):
        if model == "unknown":
            raise KeyError(model)
        return 0.01 * prompt_tokens + 0.1 * output_tokens


def finished(rid, service="svc", model="ms", prompt=10, generated=5, executed=3.0):
    r = w(rid, service, prompt=prompt, model=model)
    r.phase, r.generated, r.first_scheduled_s, r.executed_s = "decode", generated, 0.0, executed
    return r


def test_service_mean_is_learned_from_single_request_time():
    """Eq. 7's L̂ is the profiled execution time of the request alone, not its batched iterations."""
    p = DoublingBudget(DoublingBudgetOptions(cost=Solo()))
    assert isinstance(p.cost, SoloCost) and p.exec_time == "solo"
    p.on_finish(finished("a", executed=3.0), 4.0)  # batched: 3 s; alone: 0.1 + 0.5 = 0.6 s
    p.on_finish(finished("b", prompt=20, generated=10, executed=9.0), 9.0)  # alone: 0.2 + 1.0 = 1.2 s
    assert p.stats.mean("svc") == pytest.approx(0.9) and p.budget_unit("svc") == pytest.approx(
        0.9 + p.stats.std("svc")
    )
    # the earlier variant: the summed batched iteration durations
    q = DoublingBudget(DoublingBudgetOptions(cost=Solo(), exec_time="executed"))
    assert q.cost is None
    q.on_finish(finished("a", executed=3.0), 4.0)
    q.on_finish(finished("b", executed=9.0), 9.0)
    assert q.stats.mean("svc") == pytest.approx(6.0)
    # a model the cost model does not know falls back to the executed time, counted
    p.on_finish(finished("c", "other", model="unknown", executed=2.5), 5.0)
    assert p.stats.mean("other") == 2.5 and p.solo_fallbacks == 1
    with pytest.raises(ValueError, match="exec_time"):
        DoublingBudget(DoublingBudgetOptions(exec_time="wall"))
    with pytest.raises(ValueError, match="solo_time"):
        DoublingBudget(DoublingBudgetOptions(cost=object()))


def test_default_solo_cost_is_the_one_gpu_cost_the_simulator_uses():
    from llmfleet.costmodel import hardware, model_arch
    from llmfleet.sim.cost import CostBook

    p = DoublingBudget()  # default: the default cost source on one A100-80GB
    r = finished("r", model="llama2-7b", prompt=300, generated=200, executed=50.0)
    p.on_finish(r, 60.0)
    book = CostBook.build(hardware("a100-80gb"), {"llama2-7b": model_arch("llama2-7b")})
    assert p.stats.mean("svc") == pytest.approx(book.solo_time("llama2-7b", 1, 300, 200), rel=1e-12)
    h100 = DoublingBudget(DoublingBudgetOptions(cost={"hardware": "h100"}))
    assert h100.execution_time(r, 60.0) < p.execution_time(r, 60.0)
    from llmfleet.costmodel.roofline import solo_time

    roof = DoublingBudget(DoublingBudgetOptions(cost={"source": "roofline"}))
    want = solo_time(model_arch("llama2-7b"), hardware("a100-80gb"), 300, 200)
    assert roof.execution_time(r, 60.0) == pytest.approx(want, rel=1e-12)
    # a model outside the catalog (the tests' "ms") keeps the executed time
    assert p.execution_time(finished("x", executed=1.25), 2.0) == 1.25 and p.solo_fallbacks == 1


def test_admission_modes_on_a_running_batch_that_has_not_used_its_budget():
    """A running request still in its first budget ranks ahead of its service's new requests: the
    literal Algorithm 2 decodes it, ``prefill_first`` admits the new ones first, ``mixed`` runs both;
    all three keep DB's choice of service (the long service's prefill waits)."""
    picks = {}
    for mode in ("literal", "prefill_first", "mixed"):
        p = policy(admission=mode)
        run1, run2 = d("r1", arrival=0.0), d("r2", arrival=0.5)
        new1, new2 = w("n1", arrival=1.0), w("n2", arrival=1.5)
        other = w("lw", "long", arrival=0.2)
        arrive(p, run1, run2, new1, new2, other)
        p.charge(run1, 0.05)  # used part of its budget: O_r below every fresh request's
        picks[mode] = p.next_batch([new1, new2, other], [run1, run2], BIG, BatchLimits(), 2.0)
    assert picks["literal"] == Batch("ms", "decode", ("r1", "r2"))
    assert picks["prefill_first"] == Batch("ms", "prefill", ("n1", "n2"))
    assert picks["mixed"] == Batch("ms", "mixed", ("r1", "r2", "n1", "n2"))


def test_prefill_first_slots_and_pool_then_decodes():
    p = policy(admission="prefill_first")
    runs = [d(f"r{i}", arrival=float(i)) for i in range(3)]
    waits = [w(f"n{i}", arrival=5.0 + i, prompt=31) for i in range(3)]  # 2 blocks each
    arrive(p, *runs, *waits)
    # max_requests 4 with 3 running: one slot for a new request
    assert p.next_batch(waits, runs, BIG, BatchLimits(max_requests=4), 9.0).request_ids == ("n0",)
    # no slot left: the service's decodes run
    b = p.next_batch(waits, runs, BIG, BatchLimits(max_requests=3), 9.0)
    assert b == Batch("ms", "decode", ("r0", "r1", "r2"))
    tight = PoolView(free_blocks=3, watermark_blocks=0, tokens_per_block={"ms": 16})  # one admission
    assert p.next_batch(waits, runs, tight, BatchLimits(), 9.0).request_ids == ("n0",)
    full = PoolView(free_blocks=1, watermark_blocks=0, tokens_per_block={"ms": 16})  # none
    assert p.next_batch(waits, runs, full, BatchLimits(), 9.0).phase == "decode"


def test_service_modes_admit_nothing_past_a_blocked_top_prefill():
    """The top request is a prefill the pool cannot take: the best decode runs and no other prefill
    is admitted, whatever the mode (its KV would delay the blocked head further)."""
    for mode in ("prefill_first", "mixed"):
        p = policy(admission=mode)
        huge = w("huge", "long", prompt=1000)
        small = w("small", "long", arrival=1.0)
        dec = d("dec", "long", arrival=0.5)
        arrive(p, huge, small, dec)
        pool = PoolView(free_blocks=10, watermark_blocks=0, tokens_per_block={"ms": 16, "ml": 16})
        assert p.next_batch([huge, small], [dec], pool, BatchLimits(), 2.0) == Batch("ml", "decode", ("dec",))
        assert p.next_batch([huge, small], [], pool, BatchLimits(), 2.0) == Batch("ml", "prefill", ("small",))


def test_starving_service_seed_leads_its_batch_in_every_mode():
    for mode in ("prefill_first", "mixed", "literal"):
        p = policy(admission=mode, starvation_threshold_s={"long": 1.0})
        fresh = w("fresh", "long", arrival=9.5)
        stalled = w("stalled", "long", arrival=0.0)
        p.budget(stalled).left_s = 50.0  # lowest priority of its service, but stalled longest
        short = w("s", "short", arrival=9.0)
        arrive(p, fresh, stalled, short)
        lim = BatchLimits(max_requests=1)
        assert p.next_batch([fresh, stalled, short], [], BIG, lim, 10.0).request_ids == ("stalled",)


def test_admission_is_validated_and_default_is_mixed():
    assert DoublingBudget().admission == "mixed"
    with pytest.raises(ValueError, match="admission"):
        DoublingBudget(DoublingBudgetOptions(admission="fcfs"))


def _ranked_batch(p, waiting, running, pool, limits):
    """DB's ``mixed`` batch with no starving service, from the whole ranking: every request by
    (O_r, arrival, id), prefills first on a tie; the seed is its head, else (a prefill that does not fit)
    the best decode with no prefill admitted, else the best prefill that fits."""
    key = lambda r: (p.priority_of(r), r.arrival_s, r.request_id)  # noqa: E731
    ranked = sorted(
        [(r, "prefill") for r in waiting] + [(r, "decode") for r in running], key=lambda t: key(t[0])
    )
    seed, phase = ranked[0]
    blocked = False
    if phase == "prefill" and not fits_alone(pool, seed):
        alt = next((t for t in ranked if t[1] == "decode"), None)
        blocked = alt is not None
        alt = alt or next((t for t in ranked if t[1] == "prefill" and fits_alone(pool, t[0])), None)
        if alt is None:
            return None
        seed, phase = alt
    same = [t for t in ranked if t[0].service == seed.service and t[0].model == seed.model]
    runs = [r for r, ph in same if ph == "decode" and r is not seed]
    runs = ([seed] if phase == "decode" else []) + runs
    waits = (
        []
        if blocked
        else ([seed] if phase == "prefill" else [])
        + [r for r, ph in same if ph == "prefill" and r is not seed]
    )
    runs = runs[: limits.max_requests]
    admitted = admit_prefills(waits, pool, limits, limits.max_requests - len(runs))
    kind = "mixed" if runs and admitted else ("decode" if runs else "prefill")
    return Batch(seed.model, kind, tuple(r.request_id for r in (*runs, *admitted)))


@pytest.mark.parametrize("seed", range(40))
def test_mixed_batch_is_built_from_the_whole_ranking(seed):
    rng = random.Random(seed)
    p = policy(admission="mixed", starvation_factor=None)
    services = [("short", "ms"), ("long", "ml"), ("short", "m2")]
    waiting, running = [], []
    for i in range(rng.randint(0, 30)):
        svc, model = rng.choice(services)
        make = w if rng.random() < 0.6 else d
        # few distinct arrivals and prompt sizes: ties in O_r and arrival are common
        r = make(f"r{i:02d}", svc, float(rng.randint(0, 3)), rng.choice((15, 200, 900)), model)
        (waiting if make is w else running).append(r)
    arrive(p, *waiting, *running)
    for r in running:  # some budgets used, some renewed
        for _ in range(rng.randint(0, 3)):
            p.charge(r, rng.choice((0.01, 0.05, 0.2)))
    rng.shuffle(waiting)
    rng.shuffle(running)
    pool = PoolView(
        free_blocks=rng.choice((5, 20, 60, 10_000)),
        watermark_blocks=0,
        tokens_per_block={"ms": 16, "ml": 16, "m2": 16},
    )
    limits = BatchLimits(max_requests=rng.choice((2, 4, 256)), max_prefill_tokens=rng.choice((300, 4096)))
    expected = _ranked_batch(p, waiting, running, pool, limits) if waiting or running else None
    assert p.next_batch(waiting, running, pool, limits, 5.0) == expected
