"""SeaLLM Figure 2 in the simulator: two services share one instance; a long request C of S1 is
followed by short requests D and E of S0. Doubling budget (DB) beats FCFS (head-of-line blocking) and
MuxServe's round robin on normalized latency, and holds the KV of fewer requests at once than RR
(the paper: RR holds C, D and E; DB at most two)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from llmfleet.policies.dispatch import RoundRobin
from llmfleet.policies.placement import InstancePlan
from llmfleet.policies.request import DoublingBudget, Fcfs, MuxServeRR
from llmfleet.sim.cost import CostBook, LinearCost
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec

S0, S1 = "llama2-7b", "llama2-13b"
COST = LinearCost(((0.05, 0.0005, 0.0),), ((0.02, 0.001, 0.0),), "hand")


@dataclass
class W:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    service: str


REQS = [
    W("A", 0.00, 64, 8, "s0"),
    W("B", 0.00, 64, 8, "s1"),
    W("C", 0.10, 64, 150, "s1"),  # the long one
    W("D", 0.50, 64, 10, "s0"),
    W("E", 0.95, 64, 10, "s0"),
]


def seeded_db() -> DoublingBudget:
    db = DoublingBudget()
    for _ in range(5):  # the service monitor's history: S0 is short, S1 long (mean execution times)
        db.observe("s0", 0.3)
        db.observe("s1", 2.0)
    return db


def run(make_policy):
    spec = SimSpec(ClusterSpec.parse("2xA100-80GB"), (SimService("s0", S0), SimService("s1", S1)))
    cost = CostBook.build(spec.cluster.hw, spec.archs())
    cost.pin(S0, 2, COST)
    cost.pin(S1, 2, COST)
    sim = Simulator(
        spec, [InstancePlan("g0", (S0, S1), 2)], make_policy, RoundRobin(), cost, fast_forward=False
    )
    holders = []
    sim.every(0.01, lambda s, now: holders.append(len(s.instances["g0"].running)))
    res = sim.run(REQS)
    assert all(r.done for r in res.records)
    solo = {s: sum(r.solo_s for r in res.records if r.service == s) / 2 if s == "s1" else
            sum(r.solo_s for r in res.records if r.service == s) / 3 for s in ("s0", "s1")}  # fmt: skip
    norm = sum(r.latency_s / solo[r.service] for r in res.records) / len(res.records)
    return norm, max(holders), {r.request_id: r for r in res.records}


@pytest.fixture(scope="module")
def results():
    return {"db": run(seeded_db), "fcfs": run(Fcfs), "rr": run(MuxServeRR)}


def test_db_has_the_lowest_normalized_latency(results):
    db, fcfs, rr = (results[k][0] for k in ("db", "fcfs", "rr"))
    assert db < fcfs and db < rr, results


def test_fcfs_blocks_short_requests_behind_the_long_one(results):
    recs_fcfs, recs_db = results["fcfs"][2], results["db"][2]
    assert recs_fcfs["D"].finish_s > recs_fcfs["C"].finish_s  # head-of-line blocking
    assert recs_db["D"].finish_s < recs_db["C"].finish_s


def test_db_holds_fewer_kv_entries_than_rr(results):
    assert results["db"][1] <= 2 < results["rr"][1] == 3, (results["db"][1], results["rr"][1])
