"""The simulator holds arrivals in the live scheduler's hold queue: with late binding, a light tenant
flooded by a heavy one (10x its requests, all at once) is served its share while the heavy backlog
waits (fairness vtc), where arrival order serves it last; a sheddable arrival is dropped at its
service's TTFT SLO; a higher priority leaves first."""

from __future__ import annotations

import statistics

import pytest
from llmfleet.engine_core.core import DEFAULT_PREEMPTION
from llmfleet.policies.capacity import Saturation
from llmfleet.policies.dispatch import JoinShortestQueue
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import Fcfs
from llmfleet.policies.request.preemption import PreemptionRule
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import EngineSettings, SimService
from llmfleet.spec.defaults import Fairness
from llmfleet.types import Slo
from llmfleet.workload import WorkloadRequest as W

S7 = SimService("s", "llama2-7b", Slo(ttft_s=2.0, tpot_s=1.0))
PLAN = [InstancePlan("i0", ("llama2-7b",), 1)]


def flood() -> list[W]:
    heavy = [W(f"h{i}", i * 0.01, 200, 100, "s", tenant="heavy") for i in range(100)]
    light = [W(f"l{i}", 0.5 + i * 0.5, 200, 100, "s", tenant="light") for i in range(10)]
    return sorted(heavy + light, key=lambda w: w.arrival_s)


def run(
    tiny, work: list[W], fairness: Fairness, preemption: PreemptionRule | None = DEFAULT_PREEMPTION
) -> list[RequestRecord]:
    spec = tiny.spec(services=(S7,), cluster="1xA100-80GB", engine=EngineSettings(max_running=4))
    sim = Simulator(spec, PLAN, Fcfs, JoinShortestQueue(), tiny.book(spec), preemption=preemption)
    sim.fleet.set_binding("late", Saturation(queue_slack=0))
    sim.fleet.fairness = fairness
    return sim.run(work, strict_services=True).records


def ttft(records: list[RequestRecord], tenant: str) -> float:
    return statistics.median(r.ttft_s for r in records if r.tenant == tenant and r.done)


def test_a_light_tenant_is_not_queued_behind_a_heavy_backlog(tiny) -> None:
    fair, fifo = run(tiny, flood(), "vtc"), run(tiny, flood(), "none")
    assert all(r.done for r in fair) and all(r.done for r in fifo)
    assert ttft(fair, "light") < ttft(fifo, "light") / 5
    assert ttft(fair, "light") < ttft(fair, "heavy")


def test_sheddable_arrivals_are_dropped_at_their_ttft_slo_and_priorities_go_first(tiny) -> None:
    work = [W(f"n{i}", 0.0, 200, 100, "s") for i in range(12)]
    work += [W("low", 0.01, 200, 100, "s", priority=-1), W("top", 0.02, 200, 100, "s", priority=3)]
    records = {r.request_id: r for r in run(tiny, work, "vtc")}
    assert "shed" in records["low"].failed and not records["low"].done
    top, held = records["top"].first_token_s, sorted(records[f"n{i}"].first_token_s or 0 for i in range(12))
    assert top is not None and top < held[4]  # before every n that was held (4 run at once)


def test_a_light_tenant_preempts_the_heavy_backlog_on_a_saturated_instance(tiny) -> None:
    # with vtc the held light request goes to the saturated instance (preempt_room) and preempts a
    # heavy one there (three light keys: each preempts one of the heavy key's four): its first token
    # comes at once, not after a heavy request's 400 tokens
    heavy = [W(f"h{i}", 0.0, 200, 400, "s", tenant="heavy") for i in range(12)]
    light = [W(f"l{i}", 0.5 + i * 0.5, 200, 20, "s", tenant=f"light{i}") for i in range(3)]
    records = run(tiny, heavy + light, "vtc")
    assert all(r.done for r in records)
    lights = [r for r in records if r.tenant != "heavy"]
    heavies = [r for r in records if r.tenant == "heavy"]
    slot_s = min(r.latency_s for r in heavies)  # the wait for a slot to free, without preemption
    assert max(r.ttft_s for r in lights) < 0.2 * slot_s
    assert sum(r.preemptions for r in heavies) == len(lights)  # each light key preempts one
    assert max(r.preemptions for r in heavies) <= 2  # the cap


def burst(tiny, preemption: PreemptionRule | None = DEFAULT_PREEMPTION) -> dict[str, RequestRecord]:
    light = [W("l0", 0.0, 200, 3000, "s", tenant="light")]
    light += [W(f"l{i}", 15.0 + 0.01 * i, 200, 20, "s", tenant="light") for i in (1, 2)]
    heavy = [W(f"h{i}", 0.001 * (i + 1), 200, 1000, "s", tenant="heavy") for i in range(12)]
    work = sorted(light + heavy, key=lambda w: w.arrival_s)
    records = {r.request_id: r for r in run(tiny, work, "vtc", preemption)}
    assert all(r.done for r in records.values())
    slot_s = min(r.latency_s for r in records.values() if r.tenant == "heavy")
    assert slot_s > 10.0  # a heavy request holds its slot this long
    return records


def test_a_light_tenant_with_credit_bursts_past_its_share(tiny) -> None:
    # the light tenant holds one slot of its entitled two for 15 s (one long request) while the heavy
    # tenant holds three: at its burst the second light request preempts by the plain rule, the third
    # by credit (the holds' tracker and the instance's core agree), not after a heavy request's end
    records = burst(tiny)
    assert records["l1"].ttft_s < 1.0 and records["l2"].ttft_s < 1.0


def test_the_instances_and_the_holds_follow_the_rule_the_simulator_is_given(tiny) -> None:
    no_credit = burst(tiny, PreemptionRule(credit_window_s=0))  # instantaneous shares: l2 is past its share
    assert no_credit["l1"].ttft_s < 1.0 and no_credit["l2"].ttft_s > 1.0
    priority_only = burst(tiny, PreemptionRule(fairness=False))  # no fairness among tenants: both wait
    assert priority_only["l1"].ttft_s > 1.0 and priority_only["l2"].ttft_s > 1.0
    assert sum(r.preemptions for r in priority_only.values()) == 0


def test_a_higher_priority_preempts_a_running_lower_one(tiny) -> None:
    work = [W(f"n{i}", 0.0, 200, 100, "s") for i in range(4)] + [W("top", 0.5, 200, 100, "s", priority=3)]
    records = {r.request_id: r for r in run(tiny, work, "vtc")}
    assert all(r.done for r in records.values())
    top = records["top"]
    slot_s = min(records[f"n{i}"].latency_s for i in range(4))  # the wait for a slot, without preemption
    assert top.ttft_s is not None and top.ttft_s < 0.2 * slot_s  # the next step, not a slot freeing
    assert sum(records[f"n{i}"].preemptions for i in range(4)) == 1


@pytest.mark.parametrize("window_s", [10.0, 0.0])
def test_on_two_instances_each_keeps_its_own_credit_and_a_light_burst_passes(tiny, window_s: float) -> None:
    # the heavy tenant fills both instances (4 slots each) and keeps a backlog; the light tenant sends
    # one long request, then after 15 s a burst of four: late binding spreads the burst over the two
    # saturated instances, where each core (and the holds' tracker of each) preempts heavy requests;
    # without credit three pass on instantaneous shares (2 a side, l0 holding one) and one waits
    spec = tiny.spec(services=(S7,), cluster="2xA100-80GB", engine=EngineSettings(max_running=4))
    plan = [InstancePlan("i0", ("llama2-7b",), 1), InstancePlan("i1", ("llama2-7b",), 1)]
    light = [W("l0", 0.0, 200, 3000, "s", tenant="light")]
    light += [W(f"l{i}", 15.0 + 0.01 * i, 200, 20, "s", tenant="light") for i in range(1, 5)]
    heavy = [W(f"h{i}", 0.001 * (i + 1), 200, 1000, "s", tenant="heavy") for i in range(24)]
    rule = PreemptionRule(credit_window_s=window_s)
    sim = Simulator(spec, plan, Fcfs, JoinShortestQueue(), tiny.book(spec), preemption=rule)
    sim.fleet.set_binding("late", Saturation(queue_slack=0))
    records = {r.request_id: r for r in sim.run(sorted(light + heavy, key=lambda w: w.arrival_s)).records}
    assert all(r.done for r in records.values())
    assert min(r.latency_s for r in records.values() if r.tenant == "heavy") > 10.0
    burst = sorted(r.ttft_s for r in (records[f"l{i}"] for i in range(1, 5)))
    assert burst[2] < 1.0  # three pass at once either way
    assert (burst[3] < 1.0) == (window_s > 0)  # the fourth needs credit: else a heavy request's end
    assert {records[f"l{i}"].instance for i in range(1, 5)} == {"i0", "i1"}


def test_a_services_priority_is_what_its_requests_run_at(tiny) -> None:
    """A request with no priority of its own runs at its service's, as the live scheduler sends it to
    its engine: a request of a priority-3 service preempts a running one of a priority-0 service on a
    shared instance, where the model is the same."""
    top = SimService("top", "llama2-7b", Slo(ttft_s=2.0, tpot_s=1.0), priority=3)
    spec = tiny.spec(services=(S7, top), cluster="1xA100-80GB", engine=EngineSettings(max_running=4))
    sim = Simulator(spec, PLAN, Fcfs, JoinShortestQueue(), tiny.book(spec), preemption=DEFAULT_PREEMPTION)
    sim.fleet.set_binding("late", Saturation(queue_slack=0))
    work = [W(f"n{i}", 0.0, 200, 100, "s") for i in range(4)] + [W("t", 0.5, 200, 100, "top")]
    records = {r.request_id: r for r in sim.run(work, strict_services=True).records}
    assert all(r.done for r in records.values())
    slot_s = min(records[f"n{i}"].latency_s for i in range(4))
    assert records["t"].ttft_s is not None and records["t"].ttft_s < 0.2 * slot_s
    assert sum(records[f"n{i}"].preemptions for i in range(4)) == 1
