"""Aladdin: best-fit placement (constraints b–e, ordering, re-prediction, rebalancing), worker
configuration (Eq. 6) and the linear scaler (Eq. 7). Figure 3 of the paper is reproduced exactly."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from llmfleet.costmodel.aladdin import AladdinModel, DecodeModel, PrefillModel, TpModel
from llmfleet.costmodel.hardware import hardware
from llmfleet.costmodel.models import model_arch
from llmfleet.costmodel.roofline import RooflineModel, decode_time
from llmfleet.policies.dispatch import (
    AladdinBestFit,
    AladdinBestFitOptions,
    DispatchRequest,
    EngineCandidate,
    JoinShortestQueue,
    make_dispatch_policy,
)
from llmfleet.policies.placement import (
    AladdinWorkers,
    GpuPool,
    PlacementInfeasible,
    ServiceLoad,
    make_placement_policy,
    optimal_tp,
)
from llmfleet.policies.placement.aladdin_workers import roofline_iteration_time, worker_throughput
from llmfleet.policies.scaling import AladdinLinearScaler
from llmfleet.predict import EmpiricalLengthPredictor, LengthQuery

M = "m"


def lat(k1=1e-6, c1=0.0, k2=1e-6, c2=1e-4, c3=0.01):
    return AladdinModel(PrefillModel(k1, c1), DecodeModel(k2, c2, c3))


def policy(latency=None, t_pre=100.0, t_dec=0.1, **kw):
    return AladdinBestFit(AladdinBestFitOptions({M: latency or lat()}, {M: (t_pre, t_dec)}, **kw))


def cands(*ids, running=None):
    running = running or {}
    return [EngineCandidate(e, (M,), running.get(e, 0)) for e in ids]


def rq(rid, l_in, l_out, t=0.0, service=""):
    return DispatchRequest(rid, M, service, l_in, l_out, 0, t)


def place(p, rid, l_in, l_out, t=0.0, on=None, ids=("a", "b")):
    """Place a request; ``on`` forces the engine by excluding the others."""
    ex = frozenset(e for e in ids if on is not None and e != on)
    return p.choose(M, cands(*ids), ex, rq(rid, l_in, l_out, t))


# ------------------------------------------------------------------------------------ Figure 3

# Figure 3: two workers of 9 KV units (1 unit per token), requests 1-4 arrive in this order and are
# submitted together: two long-prompt requests (4 in, 1 out) and two long-output ones (1 in, 4 out).
FIG3 = [(4, 1), (1, 4), (4, 1), (1, 4)]


def peak_kv(reqs):
    """Independent check: all start together; request j holds l_in + k tokens at iteration k ≤ l_out."""
    horizon = max(o for _, o in reqs)
    return max(sum(i + k for i, o in reqs if k <= o) for k in range(1, horizon + 1))


def test_figure3_jsq_peaks_at_10_best_fit_at_7():
    jsq, running, on_jsq = JoinShortestQueue(), {"w1": 0, "w2": 0}, {"w1": [], "w2": []}
    for r in FIG3:
        e = jsq.choose(M, cands("w1", "w2", running=running))
        running[e] += 1
        on_jsq[e].append(r)
    assert on_jsq == {"w1": [(4, 1), (4, 1)], "w2": [(1, 4), (1, 4)]}  # prompts together, outputs too
    assert [peak_kv(on_jsq[e]) for e in ("w1", "w2")] == [10, 10]  # > 9: requests must wait

    p = policy(kv_capacity_tokens=9)
    on_bf = {"w1": [], "w2": []}
    for k, r in enumerate(FIG3):
        on_bf[p.choose(M, cands("w1", "w2"), request=rq(f"r{k}", *r))].append(r)
    assert on_bf == {"w1": [(4, 1), (1, 4)], "w2": [(4, 1), (1, 4)]}  # one of each per worker
    assert [peak_kv(on_bf[e]) for e in ("w1", "w2")] == [7, 7]
    assert [p.kv_peak(e, M, 0.0) for e in ("w1", "w2")] == [7, 7]  # the policy's own (e) profile
    assert p.infeasible == 0


# ----------------------------------------------------------------------------------- constraints


def test_b_atgt_context_limit_rejects_the_fuller_worker():
    flat = lat(k2=1e-3, c2=0.0, c3=0.0)  # l_d(b) = T_dec/k2 = 1000 tokens at any batch
    for theta, gamma, want in [(0.9, 0.5, "b"), (1.0, 0.5, "a"), (0.9, 0.0, "a")]:
        p = policy(flat, t_dec=1.0, theta=theta, gamma=gamma)
        assert place(p, "r0", 500, 400) == "a"  # Σ(l_in + γ·l_out) = 700 with γ = 0.5
        # + (100 + γ·300): 950 > 0.9·1000 rejects "a"; θ = 1 or γ = 0 (600) accepts it
        assert place(p, "r1", 100, 300) == want, (theta, gamma)


def test_c_ttft_rejects_a_worker_whose_pending_prefill_is_too_long():
    pre = lat(k1=1e-3)  # t_pre = 1 ms per prompt token; T_pre = 1 s -> at most 1000 new tokens
    p = policy(pre, t_pre=1.0, t_dec=10.0)
    assert place(p, "r0", 800, 50) == "a"  # starts at t = 0.8
    assert place(p, "r1", 300, 50, t=0.1) == "b"  # t_pre(800 + 300) = 1.1 s > T_pre
    p = policy(pre, t_pre=1.0, t_dec=10.0)
    place(p, "r0", 800, 50)
    assert place(p, "r1", 300, 50, t=0.9) == "a"  # r0 has started: only 300 new tokens


def test_d_protects_ongoing_requests_slack():
    pre = lat(k1=1e-3)  # r0 (100 tokens) starts at 0.1 s; t_pre(200) = 0.2 s
    p = policy(pre, t_dec=0.1)
    assert place(p, "r0", 100, 1000) == "a"
    # just started: slack = T_dec·l_out − t_dec = 0.1·1 − 0 -> 0.2 > 0.9·0.1 rejects "a"
    assert place(p, "r1", 200, 10, t=0.1) == "b"
    p = policy(pre, t_dec=0.1)
    place(p, "r0", 100, 1000)
    # one second later r0 made ~98 tokens at t_d ≈ 10.2 ms: slack ≈ 0.1·99 − 1.0 = 8.9 s
    assert place(p, "r1", 200, 10, t=1.1) == "a"


def test_e_kv_over_future_iterations():
    # r0: 50 in, 30 out (final 80). M = 100.
    for l_in, l_out, want in [(10, 25, "b"), (30, 5, "a")]:
        p = policy(kv_capacity_tokens=100)
        assert place(p, "r0", 50, 30) == "a"
        # (10, 25): at iteration 24 r0 holds 75, r1 35 -> 110 > 100. (30, 5): Σ finals 115 > 100 but
        # r1 ends first: the peak is 55 + 35 = 90 -> fits (needs the exact profile, not Σ finals)
        assert place(p, "r1", l_in, l_out) == want


def test_e_uses_the_current_length_of_ongoing_requests():
    model = lat()
    p = policy(model, kv_capacity_tokens=100)
    place(p, "r0", 50, 30)
    t_start = model.prefill.predict(50)
    td = model.decode.predict(1, 50 + 0.5 * 30)  # the worker's iteration time with r0 alone
    now = t_start + 24.5 * td  # r0 made 25.5 tokens: 4.5 to go, holding 75.5 tokens now
    assert p.kv_peak("a", M, now) == pytest.approx(80.0)
    # from l_in, r1 (10, 25) would collide (110 > 100, previous test); from r0's current length r0
    # ends 4.5 iterations on: peak max(80 + 10 + 1 + 4.5, 10 + 25) = 95.5 <= 100
    assert place(p, "r1", 10, 25, t=now) == "a"
    assert p.kv_peak("a", M, now) == pytest.approx(95.5)


def test_e_vectorised_check_equals_the_direct_profile():
    """The O(W·b) check (breakpoint suffix sums / prefix and suffix maxima) against a direct sum."""
    rng = random.Random(3)
    ids = [f"w{k}" for k in range(5)]
    checked = 0
    for _ in range(40):
        p = policy(kv_capacity_tokens=1e9)
        t, live = 0.0, []
        for j in range(rng.randint(1, 14)):
            t += rng.uniform(0, 0.05)
            place(p, f"r{j}", rng.randint(1, 60), rng.randint(1, 40), t=t, on=rng.choice(ids), ids=ids)
            live.append(f"r{j}")
            if rng.random() < 0.2:
                p.on_finish(live.pop(rng.randrange(len(live))), "", 3, t)
        now = t + rng.uniform(0, 0.4)
        p.error_distance(M, now)  # brings starts and re-predictions up to now
        pool = p.book.pools[M]
        it, rows = pool.iters(now), np.arange(pool.slots_used)
        for _ in range(8):
            l_in, l_pred = rng.randint(1, 60), rng.randint(1, 60)
            direct = np.array([pool.kv_peak(i, float(it[i]), [(l_in, l_pred)]) for i in rows])
            pool.kv_tokens[rows] = direct
            assert pool.kv_fits(rows, it, l_in, l_pred).all()
            pool.kv_tokens[rows] = direct - 1e-3
            assert not pool.kv_fits(rows, it, l_in, l_pred).any()
            checked += len(rows)
    assert checked > 500


# -------------------------------------------------------------------------------------- ordering


def test_norm_ordering_most_loaded_first_and_least_loaded_when_infeasible():
    model = lat(k2=1e-6, c2=1e-4, c3=0.0)  # T_dec = 1: B_max = 1e4, L_max = 1e6
    ids = ("a", "b", "c")
    p = policy(model, t_dec=1.0, kv_capacity_tokens=10_000)
    place(p, "big", 3000, 1000, on="a", ids=ids)  # 1 request, Σ = 3500
    for k in range(3):
        place(p, f"s{k}", 10, 10, on="b", ids=ids)  # 3 requests, Σ = 45
    norms = p.norms(M)
    assert norms["a"] == pytest.approx(math.hypot(1 / 1e4, 3500 / 1e6))
    assert norms["b"] == pytest.approx(math.hypot(3 / 1e4, 45 / 1e6))
    assert norms["a"] > norms["b"] > norms["c"] == 0  # batch alone would rank "b" first
    assert p.choose(M, cands(*ids), request=rq("x", 10, 10)) == "a"
    assert p.choose(M, cands(*ids), frozenset({"a"}), rq("y", 10, 10)) == "b"  # then the next
    # nothing fits anywhere (KV): the least loaded worker, counted as infeasible
    assert p.choose(M, cands(*ids), request=rq("z", 9000, 5000)) == "c"
    assert p.infeasible == 1


# ---------------------------------------------------------------------------------- re-prediction


def _outlive(p, model, l_in, l_pred, iters):
    place(p, "r0", l_in, l_pred if p.predictor is None else 0)  # 0: the policy asks its predictor
    now = model.prefill.predict(l_in) + iters * model.decode.predict(1, l_in + 0.5 * l_pred)
    place(p, "probe", 1, 1, t=now, on="b")  # any later decision notices the overdue request
    return now


def test_reprediction_doubles_without_predictor():
    model = lat()
    p = policy(model)
    _outlive(p, model, 10, 8, 7.5)  # 8.5 tokens estimated > 8 predicted, no finish
    assert p.prediction("r0") == 16.0  # 2·l_pred
    assert p.state("a", M)["context"] == pytest.approx(10 + 0.5 * 16)
    assert p.repredictions == 1


def test_reprediction_uses_conditional_mean_of_the_predictor():
    model = lat()
    pred = EmpiricalLengthPredictor(min_samples=1)
    for out in (4, 4, 6, 6, 8, 8, 20, 40):
        pred.observe(LengthQuery("", prompt_tokens=10), out)
    p = policy(model, predictor=pred)
    _outlive(p, model, 10, 12, 11.5)  # the predictor's first answer: the bin's mean, 12
    assert p.prediction("r0") == pytest.approx(30.0)  # E[l_out | l_in bin, l_out > 12] = (20 + 40)/2
    assert p.error_distance(M, 1.0)["a"] > 0  # the worker is now under-estimated


# ------------------------------------------------------------------------------------- rebalance


def _rebalance_scenario():
    """a: r_long outlived its prediction (under-estimated); b: r_short finished early (over)."""
    p = policy(lat(k1=1e-3))
    place(p, "r_long", 10, 8)  # -> a, starts at 0.01 s
    place(p, "r_short", 10, 100, on="b")
    p.on_finish("r_short", "b", 5, 0.2)  # 5 < 100 predicted
    assert place(p, "new", 5, 5, t=0.5) == "a"  # re-predicts r_long; "new" starts at 0.505 s
    return p


def test_rebalance_moves_only_not_started_requests_and_reduces_error():
    p = _rebalance_scenario()
    d = p.error_distance(M, 0.5)
    assert d["a"] > 0 > d["b"]
    moves = p.rebalance(0.5)
    assert moves == [("new", "a", "b")]
    assert p.rebalance(0.5) == moves  # pure: planning changes nothing
    before = sum(abs(v) for v in d.values())
    p.apply_move("new", "b", 0.5)
    after = sum(abs(v) for v in p.error_distance(M, 0.5).values())
    assert after < before
    assert p.state("b", M)["batch"] == 1 and p.state("a", M)["batch"] == 1
    with pytest.raises(ValueError, match="started"):
        p.apply_move("r_long", "b", 0.5)

    late = _rebalance_scenario()
    assert late.started("new") is False
    # after "new" started only r_long (started) could fix the error: nothing may move
    assert late.rebalance(0.51) == []
    assert late.started("new") is True


# ------------------------------------------------------------------------------- ledger, registry


def test_finish_replace_and_roofline_models():
    arch, hw = model_arch("llama2-7b"), hardware("a100-80gb")
    cap = 40 << 30
    p = make_dispatch_policy(
        "aladdin_bestfit",
        latency_models={"llama2-7b": RooflineModel(arch, hw)},
        slos={"llama2-7b": (0.4, 0.015)},
    )
    engines = [EngineCandidate(e, ("llama2-7b",), kv_capacity_bytes=cap) for e in ("e0", "e1")]
    req = DispatchRequest("r", "llama2-7b", "", 200, 100, arch.kv_bytes_per_token, 0.0)
    assert p.choose("llama2-7b", engines, request=req) == "e0"
    assert p.state("e0", "llama2-7b")["kv_capacity_tokens"] == cap / arch.kv_bytes_per_token
    assert p.choose("llama2-7b", engines, frozenset({"e0"}), req) == "e1"  # same id: re-placed
    assert p.state("e0", "llama2-7b")["batch"] == 0 and p.state("e1", "llama2-7b")["batch"] == 1
    p.on_finish("r", "e1", 100, 5.0)
    p.on_finish("unknown", "e1", 1, 5.0)
    assert p.state("e1", "llama2-7b")["batch"] == 0 and p.prediction("r") is None


def test_registry_needs_models_and_slos():
    with pytest.raises(ValueError, match=r"aladdin_bestfit.*latency_models.*slos"):
        make_dispatch_policy("aladdin_bestfit")
    with pytest.raises(ValueError, match="no latency model"):
        policy().choose("other", [EngineCandidate("e", ("other",))])
    assert isinstance(make_placement_policy("aladdin_workers"), AladdinWorkers)


# ----------------------------------------------------------------------------- worker config


A100 = hardware("a100-80gb")
TABLE2 = {"llama2-70b": 0.075, "llama2-13b": 0.030, "llama2-7b": 0.015}


def test_optimal_tp_on_the_default_cost_source_and_on_the_roofline():
    """Paper: 70B→2, 13B→1, 7B→1 (PCIe A100, fitted models). The default cost source (what the
    simulator and the emulated engines charge, its per-iteration overhead included) gives 13B and 7B
    → 1. With M the engine's real pool (0.9 of the memory, activations reserved) two GPUs leave the 70B
    only ~14 GiB of KV (the paper's N·m_gpu − m_model: ~31 GiB), so 70B → 4. The roofline alone keeps
    weight reads proportional to 1/N with no fixed iteration cost: all three → 4."""
    got = {m: optimal_tp(m, A100, t, 512 * model_arch(m).kv_bytes_per_token) for m, t in TABLE2.items()}
    assert got == {"llama2-70b": 4, "llama2-13b": 1, "llama2-7b": 1}
    roof = {
        m: optimal_tp(
            m, A100, t, 512 * model_arch(m).kv_bytes_per_token,
            iteration_time=roofline_iteration_time(model_arch(m), A100),
        )
        for m, t in TABLE2.items()
    }  # fmt: skip
    assert roof == {"llama2-70b": 4, "llama2-13b": 4, "llama2-7b": 4}
    a = model_arch("llama2-70b")
    assert worker_throughput(a, A100, 1, 0.075, 512 * a.kv_bytes_per_token) == 0  # 138 GB > 80 GB


def test_worker_kv_capacity_is_the_simulated_pool():
    """Aladdin's M (Eq. 6) is the KV pool the simulator gives an instance: 0.9 × memory − weights −
    activations at the engine defaults, not N·m_gpu − m_model."""
    from llmfleet.policies.placement.aladdin_workers import kv_capacity
    from llmfleet.sim.memory import pool_layout
    from llmfleet.sim.spec import EngineSettings

    for m in TABLE2:
        a = model_arch(m)
        for n in (2, 4):
            sim = pool_layout(A100, n, [a], EngineSettings()).kv_bytes
            assert kv_capacity(a, A100, n) == sim
            assert kv_capacity(a, A100, n) < n * A100.mem_bytes - a.weight_bytes  # the paper's form
    eng = EngineSettings(mem_fraction=0.8, max_prefill_tokens=2048, max_batch_requests=64)
    a = model_arch("llama2-13b")
    assert kv_capacity(a, A100, 1, 0.8, 2048, 64) == pool_layout(A100, 1, [a], eng).kv_bytes


def test_optimal_tp_with_a_paper_shaped_fitted_tp_model_gives_the_paper_numbers():
    # t = k4·roofline(N=1)/N + c4 + k_comm·(N−1)/N with a PCIe-like 20 ms all-reduce term
    tp = TpModel(k4=1.0, c4=0.002, k_comm=0.020)

    def fitted(arch):
        return lambda n, b, ctx: tp.k4 * decode_time(arch, A100, b, ctx, 1) / n + tp.c4 + tp.comm(n)

    def n_star(paper_memory):
        return {
            m: optimal_tp(
                m, A100, (1.0, t), 512 * model_arch(m).kv_bytes_per_token, iteration_time=fitted(model_arch(m)),
                paper_memory=paper_memory,
            )
            for m, t in TABLE2.items()
        }  # fmt: skip

    # Table 3 with the paper's M = N·m_gpu − m_model; the engine's pool (0.9, activations) leaves two
    # A100s ~14 GiB of KV for the 70B, so its KV bound moves N* to 4
    assert n_star(True) == {"llama2-70b": 2, "llama2-13b": 1, "llama2-7b": 1}
    assert n_star(False) == {"llama2-70b": 4, "llama2-13b": 1, "llama2-7b": 1}


def test_aladdin_workers_split_by_demand():
    services = [
        ServiceLoad("chat7", "llama2-7b", 30.0, 200, 300),
        ServiceLoad("chat13", "llama2-13b", 10.0, 200, 300),
    ]
    planner = AladdinWorkers()
    cfg = planner.worker_config(GpuPool("a100-80gb", 24), services)
    assert {m: c["tp"] for m, c in cfg.items()} == {"llama2-13b": 1, "llama2-7b": 1}
    plan = planner.place(GpuPool("a100-80gb", 24), services)
    n = {m: sum(1 for p in plan if p.models == (m,)) for m in cfg}
    assert sum(p.tp for p in plan) == 24 and all(p.tp == 1 for p in plan)
    # D'Hondt on demand (rate × output / T_max): the 7B service's demand is the larger one
    share = cfg["llama2-7b"]["demand"] / (cfg["llama2-7b"]["demand"] + cfg["llama2-13b"]["demand"])
    assert abs(n["llama2-7b"] - 24 * share) <= 1 and n["llama2-13b"] >= 1
    assert n["llama2-7b"] > n["llama2-13b"]
    assert [p.instance_id for p in plan][:2] == ["llama2-13b-0", "llama2-13b-1"]
    with pytest.raises(
        PlacementInfeasible, match=r"needs 6 GPUs \(llama2-13b: 1, llama2-70b: 4, llama2-7b: 1\)"
    ):
        AladdinWorkers().place(GpuPool("a100-80gb", 5), [*services, ServiceLoad("x", "llama2-70b", 1.0)])


# ---------------------------------------------------------------------------------------- scaler


def test_linear_scaler_recovers_k5_c5():
    rng = random.Random(7)
    rates = [r for r in np.linspace(5, 100, 40)]
    workers = [0.37 * r + 2.4 + rng.gauss(0, 0.05) for r in rates]
    outliers = [(0.5, 9.0), (1.0, 9.0)]  # below R: not linear, must be left out of the fit
    s = AladdinLinearScaler(min_rate=2.0).fit(
        [*rates, *(r for r, _ in outliers)], [*workers, *(w for _, w in outliers)]
    )
    assert s.k5 == pytest.approx(0.37, abs=0.005) and s.c5 == pytest.approx(2.4, abs=0.1)
    exact = AladdinLinearScaler(k5=0.5, c5=1.0, min_rate=2.0)
    assert exact.workers(10) == 6  # ⌈6.0⌉ stays 6
    assert exact.workers(10.1) == 7
    assert exact.workers(0.1) == exact.workers(2.0) == 2  # below R: the count at R
    with pytest.raises(ValueError, match="two distinct rates"):
        AladdinLinearScaler(min_rate=50).fit([10, 20], [1, 2])
