"""Hand-computed tiny scenarios: one request, a join mid-decode, queueing, dispatch splits.

Costs (conftest): prefill 0.1 + 0.001·T + 1e-6·Q, decode 0.01 + 0.001·b + 1e-4·S. Every expected
number below is worked out by hand in the comments, not by calling the cost model.
"""

from __future__ import annotations

import pytest
from llmfleet.costmodel import hardware, model_arch
from llmfleet.policies.dispatch import JoinShortestQueue, RoundRobin
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import Fcfs
from llmfleet.sim.cost import CostBook, LinearCost
from llmfleet.sim.metrics import summarize
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import EngineSettings
from llmfleet.workload import WorkloadRequest as W

approx = pytest.approx


def by_id(result):
    return {r.request_id: r for r in result.records}


# --------------------------------------------------------------------------------- one request alone
@pytest.mark.parametrize("fast_forward", [True, False])
def test_single_request_hand_computed(tiny, fast_forward):
    sim = tiny.sim(fast_forward=fast_forward)
    res = sim.run([W("a", 0.0, 100, 5, "s")])
    (r,) = res.records
    # prefill of 100 tokens: 0.1 + 0.1 + 1e-6·10_000 = 0.21 → the first token
    assert r.first_token_s == approx(0.21, abs=1e-12)
    assert r.ttft_s == approx(0.21, abs=1e-12)
    # 4 decodes of one sequence with context 101..104: 0.011 + 0.0101.. = 0.0211, 0.0212, 0.0213, 0.0214
    assert r.finish_s == approx(0.21 + 0.0211 + 0.0212 + 0.0213 + 0.0214, abs=1e-12)
    assert r.latency_s == approx(0.295, abs=1e-12)
    assert r.tpot_s == approx(0.085 / 4, abs=1e-12)
    assert (r.produced, r.preemptions, r.failed, r.instance) == (5, 0, "", "i0")
    # the execution time (SeaLLM) of a lone request is exactly its simulated latency
    assert r.solo_s == approx(0.295, abs=1e-12)
    assert sim.cost.solo_time(tiny.model, 1, 100, 5) == approx(r.latency_s, abs=1e-12)
    rep = summarize(res, sim.spec.services)
    assert rep["overall"]["normalized_latency"]["mean"] == approx(1.0, abs=1e-9)
    assert rep["overall"]["ttft_s"]["p50"] == approx(0.21)
    assert rep["overall"]["latency_s"]["max"] == approx(0.295)
    assert rep["cluster"]["iterations"] == 5
    assert res.instances[0]["busy_s"] == approx(0.295, abs=1e-12)


def test_one_token_output_is_just_the_prefill(tiny):
    res = tiny.sim().run([W("a", 2.0, 40, 1, "s")])
    (r,) = res.records
    # 0.1 + 0.04 + 1e-6·1600 = 0.1416
    assert r.ttft_s == approx(0.1416) and r.latency_s == approx(0.1416) and r.tpot_s == 0.0
    assert r.solo_s == approx(0.1416)


@pytest.mark.parametrize(
    "cost, prompt, out",
    [
        # two crossing decode legs (0.02 flat vs 1e-4·S): the crossing at S = 200 lies inside 151..249,
        # so solo_time sums term by term
        (LinearCost(((0.1, 0.001, 0.0),), ((0.02, 0.0, 0.0), (0.0, 0.0, 1e-4)), "two-legs"), 150, 100),
        # one leg dominating the whole range: the closed form
        (LinearCost(((0.1, 0.001, 0.0),), ((0.02, 0.0, 0.0), (0.0, 0.0, 1e-5)), "one-wins"), 150, 100),
    ],
)
def test_solo_time_matches_a_lone_simulated_request(tiny, cost, prompt, out):
    sim = tiny.sim(cost=cost, fast_forward=False)
    (r,) = sim.run([W("a", 0.0, prompt, out, "s")]).records
    g = cost.decode_legs[1][2]
    hand = 0.1 + 0.001 * prompt + sum(max(0.02, g * (prompt + i)) for i in range(1, out))
    assert r.latency_s == approx(hand, rel=1e-12)
    assert sim.cost.solo_time(tiny.model, 1, prompt, out) == approx(r.latency_s, rel=1e-12)


@pytest.mark.parametrize(("source", "named"), [("roofline", "roofline"), ("calibrated", "calibrated:a100")])
def test_solo_time_matches_a_lone_request_on_each_cost_source(tiny, source, named):
    """The roofline (two legs) and the calibrated source (measured legs plus overhead): solo_time is
    still the lone request's simulated latency."""
    spec = tiny.spec()
    book = CostBook.build(hardware("A100-80GB"), {tiny.model: model_arch(tiny.model)}, source=source)
    for ff in (True, False):
        sim = Simulator(
            spec, [InstancePlan("i0", (tiny.model,), 1)], Fcfs, RoundRobin(), book, fast_forward=ff
        )
        (r,) = sim.run([W("a", 0.0, 700, 300, "s")]).records
        assert r.latency_s == approx(book.solo_time(tiny.model, 1, 700, 300), rel=1e-9)
        assert r.solo_s == approx(r.latency_s, rel=1e-9)
    assert book.sources() == {f"{tiny.model}@tp1": named}


# ----------------------------------------------------------------------------- a join mid-decode
@pytest.mark.parametrize("fast_forward", [True, False])
def test_second_request_joins_at_next_iteration_boundary(tiny, fast_forward):
    sim = tiny.sim(fast_forward=fast_forward)
    res = sim.run([W("a", 0.0, 100, 5, "s"), W("b", 0.215, 50, 4, "s")])
    a, b = by_id(res)["a"], by_id(res)["b"]
    # a: prefill 0.21 → token 1 at 0.21; decode (ctx 101) 0.0211 → 0.2311 (b arrived at 0.215 meanwhile)
    t = 0.21 + 0.0211
    # mixed batch at 0.2311: prefill b (0.1 + 0.05 + 0.0025 = 0.1525) + decode a (ctx 102: 0.0212),
    # one forward: the shared fixed cost min(0.1, 0.01) is paid once
    t += 0.1525 + 0.0212 - 0.01
    assert b.first_token_s == approx(t, abs=1e-12)  # 0.3948
    assert b.ttft_s == approx(0.3948 - 0.215, abs=1e-12)
    # decode both: contexts a 103 + b 51 = 154 → 0.012 + 0.0154; then 156 → 0.012 + 0.0156: a is done
    t += 0.0274 + 0.0276
    assert a.finish_s == approx(t, abs=1e-12)  # 0.4498
    assert a.first_token_s == approx(0.21, abs=1e-12)
    # b alone: context 53 → 0.011 + 0.0053
    t += 0.0163
    assert b.finish_s == approx(t, abs=1e-12)  # 0.4661
    # a was slowed down by b: its latency exceeds its solo time (0.295) by the joined work
    assert a.latency_s == approx(0.4498, abs=1e-12) and a.solo_s == approx(0.295, abs=1e-12)
    assert res.instances[0]["iterations"] == 6
    assert res.instances[0]["busy_s"] == approx(0.4661, abs=1e-12)


def test_fast_forward_chunk_is_cut_by_an_arrival(tiny):
    """With fast-forward, a's four decodes are one chunk; b's arrival cuts it to the iteration in progress."""
    on = tiny.sim(fast_forward=True).run([W("a", 0.0, 100, 5, "s"), W("b", 0.215, 50, 4, "s")])
    alone = tiny.sim(fast_forward=True).run([W("a", 0.0, 100, 5, "s")])
    off = tiny.sim(fast_forward=False).run([W("a", 0.0, 100, 5, "s")])
    # alone: arrival, prefill end, one chunk end = 3 events (vs 6 one iteration at a time)
    assert alone.events == 3 and off.events == 6
    assert on.records[0].finish_s == approx(0.4498, abs=1e-12)


# ------------------------------------------------------------------------------------- queueing
def test_queueing_with_one_request_slot(tiny):
    sim = tiny.sim(engine=EngineSettings(max_running=1, max_batch_requests=1))
    res = sim.run([W("a", 0.0, 100, 5, "s"), W("b", 0.05, 100, 5, "s")])
    a, b = by_id(res)["a"], by_id(res)["b"]
    assert a.finish_s == approx(0.295, abs=1e-12)
    # b waits for a's slot (0.05 → 0.295), then runs its own 0.295 alone
    assert b.first_token_s == approx(0.295 + 0.21, abs=1e-12)
    assert b.finish_s == approx(0.59, abs=1e-12)
    assert b.latency_s == approx(0.54, abs=1e-12)  # 0.245 s of waiting + 0.295 s of work
    assert b.ttft_s == approx(0.455, abs=1e-12)
    rep = summarize(res, sim.spec.services)
    # normalized latency = latency / the service's mean solo time (0.295)
    assert rep["overall"]["normalized_latency"]["max"] == approx(0.54 / 0.295)
    assert rep["overall"]["normalized_latency"]["mean"] == approx((1 + 0.54 / 0.295) / 2)


# -------------------------------------------------------------------------------------- dispatch
WORK = [
    W("a", 0.0, 100, 50, "s"),  # long: runs until ~1.4 s on its instance
    W("b", 0.01, 10, 2, "s"),  # short: done by ~0.13 s
    W("c", 1.0, 10, 2, "s"),  # a still runs, b is gone
    W("d", 1.01, 10, 2, "s"),
]


def test_round_robin_alternates_instances(tiny):
    res = tiny.sim(instances=2, dispatch=RoundRobin()).run(WORK)
    assert {r.request_id: r.instance for r in res.records} == {"a": "i0", "b": "i1", "c": "i0", "d": "i1"}
    assert all(r.done for r in res.records)


def test_jsq_goes_to_the_shortest_queue(tiny):
    res = tiny.sim(instances=2, dispatch=JoinShortestQueue()).run(WORK)
    # b: i0 holds a → i1; c: i0 holds a, i1 is empty → i1; d: both hold one → the smaller id, i0
    assert {r.request_id: r.instance for r in res.records} == {"a": "i0", "b": "i1", "c": "i1", "d": "i0"}
    assert all(r.done for r in res.records)
