"""Closed-loop turns in the simulator: a request that follows another arrives its think time after that
request finished, wherever the simulator reads it; a turn whose predecessor failed is never sent."""

from __future__ import annotations

from dataclasses import replace

import pytest
from llmfleet.sim.metrics import summarize
from llmfleet.sim.partition import run_partitioned
from llmfleet.sim.run import preset, simulate
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.types import Slo
from llmfleet.workload import Workload
from llmfleet.workload import WorkloadRequest as W
from llmfleet.workload.conversations import conversations
from llmfleet.workload.followups import PREDECESSOR_FAILED

BLOCK = 16 * 524_288


def records(res):
    return {r.request_id: r for r in res.records}


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_turn_arrives_its_think_time_after_the_one_before_finished(tiny, fast_forward):
    """b follows a (read before a finished: it waits); c follows b and is read after b finished."""
    sim = tiny.sim(fast_forward=fast_forward)
    reqs = [
        W("a", 0.0, 20, 40, "s"),
        W("b", 0.5, 20, 5, "s", follows="a", think_s=0.5),
        W("x", 30.0, 20, 5, "s"),  # read after b finished: c behind it is released at once
        W("c", 31.0, 20, 5, "s", follows="b", think_s=30.0),
    ]
    r = records(sim.run(reqs))
    assert all(rec.done for rec in r.values())
    assert r["a"].finish_s > 0.5  # so b could not arrive at its earliest time
    assert r["b"].arrival_s == pytest.approx(r["a"].finish_s + 0.5)
    assert r["b"].finish_s < 30.0
    assert r["c"].arrival_s == pytest.approx(r["b"].finish_s + 30.0)
    assert r["b"].ttft_s < 0.5  # counted from when it was sent


def test_the_turns_after_a_failed_turn_are_not_sent(tiny):
    sim = tiny.sim(engine=EngineSettings(kv_bytes=10 * BLOCK, watermark=0.0))
    reqs = [
        W("big", 0.0, 1000, 5, "s"),  # can never fit
        W("b", 1.0, 20, 5, "s", follows="big", think_s=1.0),
        W("c", 2.0, 20, 5, "s", follows="b", think_s=1.0),
        W("d", 3.0, 20, 5, "s"),
    ]
    r = records(sim.run(reqs))
    assert "KV blocks" in r["big"].failed and r["d"].done
    assert r["b"].failed == r["c"].failed == PREDECESSOR_FAILED
    assert r["b"].arrival_s == 1.0 and r["b"].first_token_s is None


def test_hooks_keep_ticking_while_a_turn_is_in_its_think_time(tiny):
    """Nothing runs between a's end and b's arrival, yet a periodic hook must see b arrive."""
    sim = tiny.sim()
    ticks: list[float] = []
    sim.every(1.0, lambda _sim, now: ticks.append(now))
    r = records(sim.run([W("a", 0.0, 20, 5, "s"), W("b", 10.0, 20, 5, "s", follows="a", think_s=10.0)]))
    assert r["b"].done and r["b"].arrival_s == pytest.approx(r["a"].finish_s + 10.0)
    assert max(ticks) >= r["b"].arrival_s


def test_conversations_at_saturation_never_send_a_turn_before_its_history_is_answered():
    spec = SimSpec(ClusterSpec.parse("1xA100-80GB"), (SimService("chat", "llama2-7b", Slo(ttft_s=1.0)),))
    work = conversations(300, rate=40.0, mean_turns=4.0, system_tokens=200, think_s=1.0, seed=5)
    assert work.closed_loop
    exp = simulate(spec, work, preset("fcfs-jsq"), samples=5, workers=2)  # not split: turns are coupled
    assert exp.result.workers == 1
    r = records(exp.result)
    follows = {w.request_id: w for w in work if w.follows}
    assert follows and all(rec.done for rec in r.values())
    late = 0
    for rid, w in follows.items():
        before = r[w.follows]
        assert r[rid].arrival_s == pytest.approx(before.finish_s + w.think_s)
        late += r[rid].arrival_s > w.arrival_s + 1e-9
    assert late > len(follows) / 2  # saturated: most turns wait for a slow answer


def test_a_partitioned_run_refuses_closed_loop_turns(tiny):
    sim = tiny.sim(instances=2)
    with pytest.raises(ValueError, match="closed-loop"):
        run_partitioned(sim, list(Workload((W("a", 0.0, 5, 5, "s"), W("b", 1.0, 5, 5, "s", follows="a")))), 2)


def test_a_simulated_engine_caches_the_answer_the_next_turn_resends():
    """One instance holds every conversation: with the answers' token ids known (output_seed), a turn
    finds the previous answer cached too; without them only the previous prompts."""
    spec = SimSpec(ClusterSpec.parse("1xA100-80GB"), (SimService("chat", "llama2-7b", Slo(ttft_s=1.0)),))
    work = conversations(40, rate=2.0, mean_turns=4.0, system_tokens=200, think_s=1.0, seed=5)
    blind = Workload(tuple(replace(r, output_seed=None) for r in work))

    def hit_rate(w: Workload) -> float:
        (inst,) = simulate(spec, w, preset("fcfs-jsq"), samples=2).result.instances
        return inst["prefix_hits"] / inst["prefix_queries"]

    with_answers, prompts_only = hit_rate(work), hit_rate(blind)
    assert with_answers > prompts_only + 0.05 and with_answers > 0.85


def test_each_request_records_what_its_first_prefill_found_cached():
    """The report's ``prefix_cache`` (the schema a live run fills from the engines' usage) adds up the
    requests' own counts, which add up to the engine's hits when nothing is prefilled twice."""
    spec = SimSpec(ClusterSpec.parse("1xA100-80GB"), (SimService("chat", "llama2-7b", Slo(ttft_s=1.0)),))
    work = conversations(40, rate=2.0, mean_turns=4.0, system_tokens=200, think_s=1.0, seed=5)
    result = simulate(spec, work, preset("fcfs-jsq"), samples=2).result
    (inst,) = result.instances
    assert inst["preemptions"] == 0
    done = [r for r in result.records if r.done]
    assert len(done) == len(work) and all(r.cached_tokens is not None for r in done)
    assert sum(r.cached_tokens or 0 for r in done) == inst["prefix_hits"] > 0
    cache = summarize(result, spec.services)["overall"]["prefix_cache"]
    assert cache["requests"] == len(work) and cache["cached_tokens"] == inst["prefix_hits"]
    assert cache["prompt_tokens"] == sum(r.prompt_tokens for r in done)
    assert 0 < cache["cached_share"] < 1
