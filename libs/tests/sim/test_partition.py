"""A run split across processes (``llmfleet.sim.partition``) equals the serial run, record for record."""

from __future__ import annotations

import numpy as np
import pytest
from llmfleet.costmodel import hardware
from llmfleet.policies.batching import StaticSls, StaticSlsOptions
from llmfleet.policies.dispatch import JoinShortestQueue, RoundRobin
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import DoublingBudget, Fcfs
from llmfleet.sim.cost import CostBook
from llmfleet.sim.partition import OUTCOME_FIELDS, balanced_groups, partition_blocker, run_partitioned
from llmfleet.sim.run import preset, simulate
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.types import Slo
from llmfleet.workload import Workload, WorkloadRequest, poisson

SERVICES = (
    SimService("chat", "llama2-7b", Slo(ttft_s=0.5, tpot_s=0.05, deadline_s=20.0)),
    SimService("code", "llama3-8b", Slo(ttft_s=0.5, tpot_s=0.05, deadline_s=20.0)),
    SimService("orphan", "opt-6.7b", Slo(ttft_s=0.5, tpot_s=0.05)),  # no instance hosts it
)


def workload(n: int = 400, seed: int = 0, orphans: bool = True) -> Workload:
    rng = np.random.default_rng(seed)
    times = poisson(40.0, n=n, seed=seed)
    names = ["chat", "code", "orphan"] if orphans else ["chat", "code"]
    svc = rng.choice(names, size=n, p=[0.6, 0.35, 0.05] if orphans else [0.6, 0.4])
    return Workload(
        tuple(
            WorkloadRequest(f"r{i}", float(t), int(rng.integers(8, 900)), int(rng.integers(1, 400)), str(s))
            for i, (t, s) in enumerate(zip(times.tolist(), svc.tolist(), strict=True))
        )
    )


def simulator(make_policy=Fcfs, dispatch=None, services=SERVICES) -> Simulator:
    spec = SimSpec(
        ClusterSpec.parse("8xA100-80GB"),
        services,
        EngineSettings(kv_bytes=120 * 16 * 524_288),  # small pools: preemptions happen
    )
    plan = [
        InstancePlan("a", ("llama2-7b",), 1),
        InstancePlan("b", ("llama2-7b", "llama3-8b"), 2),
        InstancePlan("c", ("llama3-8b",), 1),
        InstancePlan("d", ("llama2-7b",), 1),
        InstancePlan("e", ("llama3-8b",), 2),
    ]
    book = CostBook.build(hardware("A100-80GB"), spec.archs())
    return Simulator(spec, plan, make_policy, dispatch or RoundRobin(), book, sample_period_s=0.5)


@pytest.mark.parametrize(
    "make_policy", [Fcfs, DoublingBudget, lambda: StaticSls(StaticSlsOptions(batch_size=4))]
)
@pytest.mark.parametrize("workers", [2, 3])
def test_partitioned_equals_serial(make_policy, workers):
    work = workload()
    serial = simulator(make_policy).run(work.requests, strict_services=True)
    split = run_partitioned(simulator(make_policy), work.requests, workers, strict_services=True)
    assert split.workers == workers
    assert split.records == serial.records  # every field of every request, in arrival order
    assert split.samples == serial.samples
    assert split.instances == serial.instances
    assert (split.end_s, split.events, split.provisioned_gpus) == (
        serial.end_s,
        serial.events,
        serial.provisioned_gpus,
    )
    assert sum(r.preemptions for r in serial.records) > 0 or make_policy is not Fcfs
    orphans = [r for r in split.records if r.service == "orphan"]
    assert orphans and all("opt-6.7b" in r.failed for r in orphans)  # failed at dispatch, as serially


def test_simulate_uses_workers_only_when_exact():
    spec = SimSpec(ClusterSpec.parse("4xA100-80GB"), SERVICES[:2])
    work = workload(300, orphans=False)
    one = simulate(spec, work, preset("fcfs-rr"), samples=50)
    two = simulate(spec, work, preset("fcfs-rr"), samples=50, workers=2)
    assert (one.result.workers, two.result.workers) == (1, 2)
    assert one.result.records == two.result.records
    drop = ("wall_s", "events_per_s", "workers")
    assert {k: v for k, v in one.report["cluster"].items() if k not in drop} == {
        k: v for k, v in two.report["cluster"].items() if k not in drop
    }
    assert one.report["overall"] == two.report["overall"]
    jsq = simulate(spec, work, preset("fcfs-jsq"), samples=50, workers=2)
    assert jsq.result.workers == 1  # JSQ reads load: instances are coupled, so it runs serially


def test_blockers_are_named():
    assert "reads instance load" in partition_blocker(simulator(dispatch=JoinShortestQueue()))
    sim = simulator()
    sim.every(1.0, lambda s, now: None)
    assert "hooks" in partition_blocker(sim)
    with pytest.raises(ValueError, match="cannot partition"):
        run_partitioned(simulator(dispatch=JoinShortestQueue()), workload().requests, 2)
    assert partition_blocker(simulator()) is None


def test_unsorted_workload_is_rejected():
    reqs = list(workload(20).requests)
    reqs[3], reqs[4] = reqs[4], reqs[3]
    with pytest.raises(ValueError, match="sorted by arrival"):
        run_partitioned(simulator(), reqs, 2)


class Exploding(Fcfs):
    """Fails on its 50th batch: the error must come back from the worker process."""

    def __init__(self) -> None:
        self.calls = 0

    def next_batch(self, *a, **k):
        self.calls += 1
        if self.calls == 50:
            raise RuntimeError("policy bug on purpose")
        return super().next_batch(*a, **k)


def test_worker_error_is_raised_in_the_parent():
    with pytest.raises(RuntimeError, match="policy bug on purpose"):
        run_partitioned(simulator(Exploding), workload().requests, 2, strict_services=True)


def test_groups_balance_requests():
    groups = balanced_groups({"a": 10, "b": 1, "c": 9, "d": 2, "e": 0}, ["a", "b", "c", "d", "e"], 2)
    assert sorted(map(sorted, groups)) == [["a", "b", "e"], ["c", "d"]]
    assert balanced_groups({}, ["a"], 4) == [["a"]]


def test_a_group_without_requests_runs_no_process_and_still_counts():
    services = (*SERVICES, SimService("idle", "mistral-7b", Slo(ttft_s=0.5, tpot_s=0.05)))

    def build() -> Simulator:
        sim = simulator(services=services)
        spec = sim.spec
        plan = [InstancePlan(i.instance_id, i.models, i.tp) for i in sim.instances.values()] + [
            InstancePlan("f", ("mistral-7b",), 1)
        ]
        return Simulator(spec, plan, Fcfs, RoundRobin(), sim.cost, sample_period_s=0.5)

    work = workload(200)
    serial = build().run(work.requests, strict_services=True)
    split = run_partitioned(build(), work.requests, 6, strict_services=True)
    assert split.workers == 5  # six groups of one instance; "f" got no request, so no process
    assert split.records == serial.records and split.samples == serial.samples
    assert split.instances == serial.instances and split.events == serial.events


def test_outcome_fields_follow_the_record_fields():
    """Workers send outcomes positionally; the parent rebuilds RequestRecord(<request>, *outcome)."""
    import dataclasses

    from llmfleet.sim.records import RequestRecord

    names = tuple(f.name for f in dataclasses.fields(RequestRecord))
    assert names[6:] == (*OUTCOME_FIELDS, "content")  # content: the workload request, an input, last
