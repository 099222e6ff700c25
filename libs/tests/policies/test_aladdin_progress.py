"""Aladdin constraint (d) on measured per-request progress, the iteration clock that stands still for
prefills, and (b) with the worker's prefill load (paper §4.2, MIP constraints (b) and (d))."""

from __future__ import annotations

import pytest
from llmfleet.costmodel.aladdin import AladdinModel, DecodeModel, PrefillModel
from llmfleet.policies.dispatch import (
    AladdinBestFit,
    AladdinBestFitOptions,
    DispatchNeeds,
    DispatchRequest,
    EngineCandidate,
    Rebalancer,
    RequestProgress,
)

M = "m"
T_DEC = 0.1
THETA = 0.9
# t_pre = 1 ms per prompt token; t_d = 1e-6·Σctx + 1e-4·b + 10 ms
LAT = AladdinModel(PrefillModel(1e-3, 0.0), DecodeModel(1e-6, 1e-4, 0.01))


def policy(**kw) -> AladdinBestFit:
    return AladdinBestFit(AladdinBestFitOptions({M: LAT}, {M: (100.0, T_DEC)}, theta=THETA, **kw))


def rq(rid: str, l_in: int, l_out: int, t: float) -> DispatchRequest:
    return DispatchRequest(rid, M, "", l_in, l_out, 0, t)


def cands(a=(), b=(), measured=True) -> list[EngineCandidate]:
    """Workers a and b with the progress of the requests decoding there (None: not measured)."""
    return [
        EngineCandidate("a", (M,), requests=tuple(a) if measured else None),
        EngineCandidate("b", (M,), requests=tuple(b) if measured else None),
    ]


def atgt_after_next_token(generated: int, first_token_s: float, now: float, stall_s: float) -> float:
    """ATGT of a request with ``generated`` tokens since ``first_token_s`` once its next token comes
    after ``stall_s`` more seconds: t_decode / (l_out − 1) with l_out = generated + 1."""
    return (now - first_token_s + stall_s) / generated


def old_slack(now: float, t_start: float, t_d: float) -> float:
    """The pre-fix (d) slack of one ongoing request: an iteration clock that advances at 1/t_d from its
    estimated start and never pauses, l_out = 1 + iterations, t_dec = now − t_start."""
    return T_DEC * (1.0 + (now - t_start) / t_d) - (now - t_start)


def test_needs_and_protocols():
    p = policy()
    assert p.needs.reads_progress and p.needs.load_blind and not p.needs.state_blind
    assert DispatchNeeds().state_blind and not DispatchNeeds(reads_kv=True).state_blind
    assert "per-request decode progress" in p.needs.describe()
    assert isinstance(p, Rebalancer)


def test_d_old_slack_admits_a_prefill_that_breaks_an_ongoing_atgt_and_the_fix_refuses_it():
    """r0 decodes on a; the engine was slower than the model (another scheduler's prefills stalled
    it): 1 s after its first token it has 11 tokens, ATGT exactly at T_dec. A 200-token prompt (0.2 s
    of prefill) would push r0's next token to ATGT 0.121 s > T_dec."""
    p = policy()
    assert p.choose(M, cands(), request=rq("r0", 100, 1000, 0.0)) == "a"  # first token at 0.1 s
    now, first, gen = 1.1, 0.1, 11
    stall = LAT.prefill.predict(200) + LAT.decode.predict(2, (600 + 205) / 2)
    assert atgt_after_next_token(gen, first, now, stall) > T_DEC  # the prefill breaks r0's ATGT
    # the old formula: r0 "made" 1 + 1.0/t_d ≈ 94 tokens, slack ≈ 8.4 s ≫ t_pre(200) = 0.2 s: admitted
    t_d = LAT.decode.predict(1, 100 + 0.5 * 1000)
    assert LAT.prefill.predict(200) <= THETA * old_slack(now, 0.1, t_d)
    # measured: slack = T_dec·11 − 1.0 = 0.1 s < 0.2 s: a is refused, b (empty) takes it
    prog = [RequestProgress("r0", M, gen, first)]
    assert p.choose(M, cands(a=prog), request=rq("r1", 200, 10, now)) == "b"
    assert p.infeasible == 0
    # had r0 kept pace (t_d ≈ 10.7 ms per token: 94 tokens), the same prompt fits on a
    q = policy()
    q.choose(M, cands(), request=rq("r0", 100, 1000, 0.0))
    prog = [RequestProgress("r0", M, 94, first)]
    assert atgt_after_next_token(94, first, now, stall) <= T_DEC
    assert q.choose(M, cands(a=prog), request=rq("r1", 200, 10, now)) == "a"


def test_d_includes_the_next_iteration_of_the_grown_batch():
    """Slack s with t_pre(x) ≤ θ·s < t_pre(x) + t_d(b + 1): refused (the paper's literal form would
    admit it); with t_pre(x) + t_d(b + 1) ≤ θ·s: admitted."""
    now, g, x = 2.0, 20, 100  # r0 has 20 tokens; x = 100 prompt tokens: t_pre = 0.1 s
    t_pre = LAT.prefill.predict(x)
    t_d2 = LAT.decode.predict(2, (600 + 105) / 2)
    for slack, want in (((t_pre + t_d2 / 2) / THETA, "b"), ((t_pre + t_d2) / THETA + 1e-6, "a")):
        first = now - (T_DEC * g - slack)  # slack = T_dec·g − (now − first)
        p = policy()
        p.choose(M, cands(), request=rq("r0", 100, 1000, 0.0))
        prog = [RequestProgress("r0", M, g, first)]
        assert p.choose(M, cands(a=prog), request=rq("r1", x, 10, now)) == want, slack


def test_d_protects_requests_the_dispatcher_did_not_place():
    """Any request decoding on the worker counts (e.g. placed by another scheduler replica)."""
    p = policy()
    fresh = [RequestProgress("someone-else", M, 1, 0.95)]  # just started: slack = T_dec
    assert p.choose(M, cands(a=fresh, b=fresh), request=rq("r1", 300, 10, 1.0)) == "a"  # none feasible
    assert p.infeasible == 1
    banked = [RequestProgress("someone-else", M, 200, 0.0)]  # ATGT 5 ms so far: 19 s banked
    q = policy()
    assert q.choose(M, cands(a=fresh, b=banked), request=rq("r1", 300, 10, 1.0)) == "b"
    assert q.infeasible == 0


def test_measured_start_keeps_a_queued_prefill_pending():
    """Measured: our request starts at its first token, not at the estimate; until then its prompt is
    a pending prefill ((c) and (d) count it)."""
    p = AladdinBestFit(AladdinBestFitOptions({M: LAT}, {M: (1.0, 10.0)}, theta=1.0))
    assert p.choose(M, cands(), request=rq("r0", 800, 50, 0.0)) == "a"  # estimated start 0.8 s
    # at 0.9 s the engine has not produced r0's first token (it queued): 800 + 300 > 1000 tokens of TTFT
    assert p.choose(M, cands(), request=rq("r1", 300, 50, 0.9)) == "b"
    assert p.started("r0") is False
    # its first token shows at 0.95 s: it is ongoing, only r2's own prompt is new on a
    assert p.choose(M, cands(a=[RequestProgress("r0", M, 2, 0.95)]), request=rq("r2", 300, 50, 1.0)) == "a"
    assert p.started("r0") is True
    # without measurement the estimate starts it at 0.8 s (the former behaviour)
    q = AladdinBestFit(AladdinBestFitOptions({M: LAT}, {M: (1.0, 10.0)}, theta=1.0))
    q.choose(M, cands(measured=False), request=rq("r0", 800, 50, 0.0))
    assert q.choose(M, cands(measured=False), request=rq("r1", 300, 50, 0.9)) == "a"


def test_estimated_clock_stands_still_for_prefills():
    """Without measured progress, an admitted prefill consumes (d)'s slack: the old clock kept running
    through it, so the slack only grew and a second long prefill was admitted during the first. (The
    protection of requests whose prefill has not ended is off here: it is tested on its own below.)"""
    p = policy(protect_prefills=False)
    assert p.choose(M, cands(measured=False), request=rq("r0", 100, 1000, 0.0)) == "a"  # starts 0.1 s
    t_d = LAT.decode.predict(1, 600)
    s1 = old_slack(0.3, 0.1, t_d)  # both formulas agree before any other prefill: ≈ 1.77 s
    assert LAT.prefill.predict(1500) + LAT.decode.predict(2, (600 + 1505) / 2) <= THETA * s1
    assert p.choose(M, cands(measured=False), request=rq("r1", 1500, 10, 0.3)) == "a"  # 1.5 s prefill
    # r1's prefill runs 0.3 → 1.8 s and r0 decodes nothing meanwhile: at 1.79 s its true slack is
    # s1 − 1.49 ≈ 0.28 s; r2's prompt joins the pending prefill batch (t_pre(3000) = 3 s)
    now = 1.79
    true_slack = s1 - (now - 0.3)
    stall = LAT.prefill.predict(3000)
    assert stall > THETA * true_slack  # r2 would break r0's ATGT
    assert stall <= THETA * old_slack(now, 0.1, t_d)  # the old clock says ≈ 14 s: it was admitted
    assert p.choose(M, cands(measured=False), request=rq("r2", 1500, 10, now)) == "b"
    pool = p.book.pools[M]
    a = pool.slot_of["a"]
    est = pool.slack(pool.cache_idx[[a]], pool.iters(now), now)[0]
    assert est == pytest.approx(true_slack, abs=1e-9)  # the clock stood still for r1's prefill


def test_b_counts_the_workers_prefill_load():
    """(b) at T_dec·(1 − ρ): decode runs only 1 − ρ of the time on a worker that spends ρ prefilling."""
    flat = AladdinModel(PrefillModel(1e-3, 0.0), DecodeModel(1e-4, 0.0, 0.0))  # l_d = T_dec/k2 = 1000

    def pol():
        # (b) alone: r0's pending prefill is not protected here
        p = AladdinBestFit(
            AladdinBestFitOptions(
                {M: flat}, {M: (100.0, T_DEC)}, theta=1.0, prefill_window_s=10.0, protect_prefills=False
            )
        )
        assert p.choose(M, cands(), request=rq("r0", 400, 200, 0.0)) == "a"  # ctx 500, 0.4 s prefill
        return p

    # r1: ctx 100 + 0.5·600 = 400, Σ 900; ρ_a = (0.4 + 0.1)/10 = 5 %: l_d(0.95·T_dec) = 950 ≥ 900
    assert pol().choose(M, cands(), request=rq("r1", 100, 600, 0.0)) == "a"
    # a also ran a 2 s prefill (a 2000-token prompt that is gone again): ρ_a = 25 %, l_d = 750 < 900,
    # while (b) at the full T_dec (the former check) admits Σ 900 ≤ 1000
    q = pol()
    q.choose(M, [EngineCandidate("a", (M,), requests=())], request=rq("big", 2000, 2, 0.0))
    q.on_finish("big", "a", 2, 0.0)
    assert q.state("a", M)["context"] == pytest.approx(500)
    assert q.choose(M, cands(), request=rq("r1", 100, 600, 0.0)) == "b"
    # the window forgets it: 10 s later the same request fits on a again
    assert q.choose(M, cands(), request=rq("r2", 100, 600, 10.5)) == "a"


def test_d_protects_requests_whose_prefill_has_not_ended():
    """r0's prefill is running (placed, no first token): its second token waits for every prefill
    placed after it, so its worker's slack is T_dec. r1's 200 ms prefill breaks that; with the
    protection off the worker looks free of ongoing requests and takes r1."""
    for protect, want in ((True, "b"), (False, "a")):
        p = policy(protect_prefills=protect)
        assert p.choose(M, cands(), request=rq("r0", 100, 50, 0.0)) == "a"
        assert p.choose(M, cands(), request=rq("r1", 200, 50, 0.05)) == want, protect
    # once r0's first token shows it is ongoing: slack T_dec·l_out − t_dec from its progress
    p = policy()
    p.choose(M, cands(), request=rq("r0", 100, 50, 0.0))
    prog = cands(a=[RequestProgress("r0", M, 40, 0.1)])
    assert p.choose(M, prog, request=rq("r1", 200, 50, 0.2)) == "a"  # slack 40·T_dec − 0.1 s holds 0.3 s
    with pytest.raises(ValueError, match="heartbeat_s"):
        policy(heartbeat_s=-1.0)
