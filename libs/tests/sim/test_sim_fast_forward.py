"""Fast-forward is exact (same records as one iteration at a time); preemption keeps KV consistent."""

from __future__ import annotations

import numpy as np
import pytest
from llmfleet.costmodel import hardware, model_arch
from llmfleet.policies.dispatch import JoinShortestQueue, LeastLoaded, RoundRobin, WorstFitKv
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import Fcfs
from llmfleet.sim.cost import CostBook
from llmfleet.sim.metrics import summarize
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import EngineSettings, SimService
from llmfleet.workload import WorkloadRequest, poisson

MODEL = "llama2-7b"
BLOCK = 16 * 524_288  # bytes of one 16-token llama2-7b block


def random_workload(n=300, rate=15.0, seed=11, max_prompt=400, max_out=200):
    rng = np.random.default_rng(seed)
    times = poisson(rate, n=n, seed=seed)
    prompts = rng.integers(1, max_prompt, n)
    outs = rng.integers(1, max_out, n)
    return [
        WorkloadRequest(f"r{i}", float(t), int(p), int(o), "s")
        for i, (t, p, o) in enumerate(zip(times, prompts, outs, strict=True))
    ]


def run(tiny, work, *, fast_forward, engine=None, dispatch=None, check_kv=None):
    spec = tiny.spec(engine)
    book = CostBook.build(hardware("A100-80GB"), {MODEL: model_arch(MODEL)})  # the default: 3–4 legs
    plan = [InstancePlan("i0", (MODEL,), 1), InstancePlan("i1", (MODEL,), 1)]
    sim = Simulator(spec, plan, Fcfs, dispatch or RoundRobin(), book, fast_forward=fast_forward)
    if check_kv is not None:  # the engine's KV bookkeeping, checked every 50 ms of simulated time
        sim.every(0.05, lambda s, now: check_kv.extend((now, *m) for m in tiny.kv_mismatches(s)))
    return sim, sim.run(work)


def assert_same_records(a, b):
    assert len(a.records) == len(b.records)
    for x, y in zip(a.records, b.records, strict=True):
        assert (x.request_id, x.instance, x.produced, x.preemptions, x.failed) == (
            y.request_id,
            y.instance,
            y.produced,
            y.preemptions,
            y.failed,
        )
        assert x.first_token_s == pytest.approx(y.first_token_s, abs=1e-9), x.request_id
        assert x.finish_s == pytest.approx(y.finish_s, abs=1e-9), x.request_id


@pytest.mark.parametrize("dispatch", [RoundRobin, JoinShortestQueue])
def test_fast_forward_is_exact_on_a_random_workload(tiny, dispatch):
    work = random_workload()
    bad: list = []
    _, on = run(tiny, work, fast_forward=True, dispatch=dispatch(), check_kv=bad)
    _, off = run(tiny, work, fast_forward=False, dispatch=dispatch(), check_kv=bad)
    assert bad == []
    assert all(r.done for r in on.records)
    assert_same_records(on, off)
    assert on.events < off.events / 2  # chunks replace most decode iterations
    assert sum(i["iterations"] for i in on.instances) == sum(i["iterations"] for i in off.instances)
    for x, y in zip(on.instances, off.instances, strict=True):
        assert x["busy_s"] == pytest.approx(y["busy_s"], rel=1e-12)


@pytest.mark.parametrize("dispatch", [LeastLoaded, WorstFitKv])
def test_fast_forward_is_exact_with_kv_aware_dispatch(tiny, dispatch):
    work = random_workload()
    _, on = run(tiny, work, fast_forward=True, dispatch=dispatch())
    _, off = run(tiny, work, fast_forward=False, dispatch=dispatch())
    assert_same_records(on, off)


def test_fast_forward_is_exact_with_preemption(tiny):
    """A 40-block pool (640 tokens) for prompts up to 400 and outputs up to 200: preemption everywhere."""
    work = random_workload(n=120, rate=20.0, seed=5)
    eng = EngineSettings(kv_bytes=40 * BLOCK)
    bad: list = []
    sim_on, on = run(tiny, work, fast_forward=True, engine=eng, check_kv=bad)
    sim_off, off = run(tiny, work, fast_forward=False, engine=eng, check_kv=bad)
    assert bad == []
    assert sum(r.preemptions for r in off.records) > 10
    assert_same_records(on, off)
    assert on.events < off.events
    for sim in (sim_on, sim_off):
        assert all(i.alloc.used_blocks == 0 and len(i.alloc) == 0 for i in sim.instances.values())


@pytest.mark.parametrize("fast_forward", [True, False])
def test_preemption_completes_everything_without_leaking_blocks(tiny, fast_forward):
    """24 blocks of 16 tokens; six requests of 64 + 120 tokens (12 blocks each at the end)."""
    sim = tiny.sim(engine=EngineSettings(kv_bytes=24 * BLOCK, watermark=0.0), fast_forward=fast_forward)
    work = [WorkloadRequest(f"r{i}", 0.01 * i, 64, 120, "s") for i in range(6)]
    res = sim.run(work)
    inst = sim.instances["i0"]
    assert inst.alloc.num_blocks == 24
    assert inst.preemptions > 0 and res.instances[0]["preemptions"] == inst.preemptions
    assert sum(r.preemptions for r in res.records) == inst.preemptions
    assert all(r.done and not r.failed and r.produced == r.output_tokens for r in res.records)
    assert inst.alloc.used_blocks == 0 and len(inst.alloc) == 0
    assert not inst.waiting and not inst.running and inst.work is None
    # FCFS preempts the newest: the first request is never the victim
    assert res.records[0].preemptions == 0
    # preemption by recompute costs time: the last finish is later than with an unbounded pool
    free = tiny.sim(fast_forward=fast_forward).run(work)
    assert max(r.finish_s for r in res.records) > max(r.finish_s for r in free.records)
    rep = summarize(res, sim.spec.services)
    assert rep["overall"]["preemptions"] == inst.preemptions and rep["overall"]["completed"] == 6


def test_preempted_request_recomputes_prompt_plus_output(tiny):
    """The re-prefill covers prompt + tokens generated so far (KV = context), output count is kept."""
    seen: list[tuple[str, int, int]] = []

    class Spy(Fcfs):
        def next_batch(self, waiting, running, pool, limits, now):
            seen.extend((r.request_id, r.prompt_tokens, r.generated) for r in waiting)
            return super().next_batch(waiting, running, pool, limits, now)

    sim = tiny.sim(engine=EngineSettings(kv_bytes=24 * BLOCK, watermark=0.0), make_policy=Spy)
    res = sim.run([WorkloadRequest(f"r{i}", 0.01 * i, 64, 120, "s") for i in range(6)])
    victims = {r.request_id for r in res.records if r.preemptions}
    assert victims
    for rid in victims:
        prompts = {p for (i, p, g) in seen if i == rid}
        assert 64 in prompts and any(p > 64 for p in prompts), (rid, prompts)
        assert all(g == 0 for (i, p, g) in seen if i == rid)  # waiting requests hold no generated tokens


def _two_model_preemption(tiny, fast_forward):
    """One instance, llama2-7b (16 tokens/block) and llama3-8b (64 tokens/block), a 16-block pool.

    x (8b) keeps llama3-8b the oldest model while c (8b) prefills alongside it; then b (7b) prefills,
    w (7b, older than c) does not fit and waits. b's decodes fill the pool; the append that finds it full
    preempts c (the newest running request, outside b's batch), which frees 6 blocks: w now fits."""
    svcs = [SimService("s", "llama2-7b"), SimService("t", "llama3-8b")]
    plan = [InstancePlan("i0", ("llama2-7b", "llama3-8b"), 1)]
    sim = tiny.sim(
        services=svcs,
        plan=plan,
        fast_forward=fast_forward,
        engine=EngineSettings(kv_bytes=16 * tiny.block_bytes, watermark=0.0),
    )
    work = [
        WorkloadRequest("x", 0.0, 64, 3, "t"),
        WorkloadRequest("b", 0.001, 100, 100, "s"),
        WorkloadRequest("w", 0.002, 60, 5, "s"),
        WorkloadRequest("c", 0.003, 320, 300, "t"),
    ]
    res = sim.run(work, strict_services=True)
    return {r.request_id: r for r in res.records}


def test_preemption_outside_the_batch_lets_a_waiting_request_in(tiny):
    r = _two_model_preemption(tiny, fast_forward=False)
    assert all(x.done for x in r.values())
    assert r["c"].preemptions == 1 and r["b"].preemptions == 0
    # w joins b's batch right after the preemption, long before b finishes
    assert r["b"].first_token_s < r["w"].first_token_s < r["b"].finish_s


def test_fast_forward_is_exact_when_a_preemption_frees_blocks(tiny):
    on = _two_model_preemption(tiny, fast_forward=True)
    off = _two_model_preemption(tiny, fast_forward=False)
    for rid in "xbwc":
        assert on[rid].first_token_s == pytest.approx(off[rid].first_token_s, abs=1e-9), rid
        assert on[rid].finish_s == pytest.approx(off[rid].finish_s, abs=1e-9), rid


def test_fast_forward_is_exact_with_doubling_budget_and_preemption():
    """DB's stable_until/on_iterations: budgets, renewals, starvation and preemption come out
    bit-identical with chunks as one iteration at a time (three services, two models, a tight pool)."""
    from dataclasses import dataclass

    from llmfleet.policies.placement.base import InstancePlan
    from llmfleet.policies.request import DoublingBudget
    from llmfleet.sim.cost import CostBook
    from llmfleet.sim.simulator import Simulator
    from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec

    @dataclass
    class R:
        request_id: str
        arrival_s: float
        prompt_tokens: int
        output_tokens: int
        service: str

    rng = np.random.default_rng(1)
    t, reqs = 0.0, []
    for i in range(400):
        t += rng.exponential(1 / 15)
        reqs.append(R(f"r{i}", t, int(rng.integers(20, 800)), int(rng.integers(1, 300)), "abc"[i % 3]))
    spec = SimSpec(
        ClusterSpec.parse("2xA100-80GB"),
        (SimService("a", "llama2-7b"), SimService("b", "llama2-13b"), SimService("c", "llama2-7b")),
        EngineSettings(kv_bytes=3 * 2**30),
    )
    plan = [InstancePlan(f"i{k}", ("llama2-7b", "llama2-13b"), 1) for k in range(2)]
    out = []
    for ff in (True, False):
        sim = Simulator(spec, plan, DoublingBudget, RoundRobin(), CostBook.build(spec.cluster.hw, spec.archs()),
                        fast_forward=ff)  # fmt: skip
        res = sim.run(reqs)
        assert all(r.done for r in res.records)
        out.append(res)
    on, off = out
    assert sum(r.preemptions for r in on.records) > 0, "the pool is sized to force preemption"
    assert on.events < off.events
    for a, b in zip(on.records, off.records, strict=True):
        assert (a.first_token_s, a.finish_s, a.preemptions) == (b.first_token_s, b.finish_s, b.preemptions)
