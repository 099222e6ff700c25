"""Request migration inside a simulation (llmfleet.sim.migration): the policies of
llmfleet.policies.migration every epoch, moves by KV or by tokens, the fluid bound in the report."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from llmfleet.policies.migration import EpochPlan, GpuState, Migration, migration_id
from llmfleet.sim.migration import MigrationLoop
from llmfleet.sim.run import PolicyBundle, simulate
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.workload import Workload, WorkloadRequest

SPEC = SimSpec(ClusterSpec.parse("6xA100-40GB"), (SimService("chat", "llama2-7b"),))


def workload(n: int = 160, rate: float = 4.0, seed: int = 0) -> Workload:
    """Conversation-like lengths: long prompts, outputs of a few hundred tokens."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    prompts = rng.integers(200, 2500, n)
    outputs = rng.integers(50, 900, n)
    return Workload(
        tuple(
            WorkloadRequest(f"r{i}", float(t[i]), int(prompts[i]), int(outputs[i]), "chat") for i in range(n)
        )
    )


def bundle(dispatch: str, migration: str | None, **kw) -> PolicyBundle:
    section = {"policy": migration or "none", **kw}
    return PolicyBundle(f"{dispatch}+{migration}", "dedicated_even", dispatch, "fcfs", migration=section)


def test_mell_packs_requests_and_reports_the_fluid_bound() -> None:
    wl = workload()
    wf = simulate(SPEC, wl, bundle("worst_fit_kv", None), samples=200).report
    mell = simulate(SPEC, wl, bundle("mell", "mell"), samples=200).report
    for r in (wf, mell):
        assert r["overall"]["completed"] == len(wl.requests) and r["overall"]["failed"] == 0
        c = r["cluster"]
        assert 0 < c["fluid_bound_gpus"] <= c["peak_active_gpus"] <= 6
    m = mell["migration"]
    assert m["epochs"] > 0 and m["planned"] >= m["executed"] > 0
    assert m["executed"] == m["kv_moves"] + m["token_moves"] + m["queued_moves"]
    # packing uses fewer GPUs on average than spreading, and keeps active GPUs fuller
    assert mell["cluster"]["mean_active_gpus"] < wf["cluster"]["mean_active_gpus"]
    assert mell["cluster"]["active_kv_utilization_mean"] > wf["cluster"]["active_kv_utilization_mean"]


def test_memory_utilization_counts_weights_and_kv_of_the_active_gpus() -> None:
    """Mell's "GPU utilization (i.e., percentage of GPU memory in use)": weights + KV in use over the
    memory of the GPUs holding requests, beside the KV-only utilization of the same GPUs."""
    from llmfleet.costmodel import hardware, model_arch

    e = simulate(SPEC, workload(80), bundle("mell", "mell"), samples=100)
    weights, hbm = model_arch("llama2-7b").weight_bytes, hardware("a100-40gb").mem_bytes
    busy = [s for s in e.result.samples if s.active_gpus]
    assert busy
    for s in busy:
        assert s.active_mem_capacity == s.active_gpus * hbm
        assert s.active_mem_used == s.active_gpus * weights + s.kv_used  # idle instances hold no KV
    c = e.report["cluster"]
    want = np.mean([s.active_mem_used / s.active_mem_capacity for s in busy])
    assert c["active_memory_utilization_mean"] == pytest.approx(want)
    kv_only = np.mean([s.kv_used / s.active_kv_capacity for s in busy])
    assert c["active_kv_utilization_mean"] == pytest.approx(kv_only)
    # the weights (13.5 GB of 40 GB) count as in use: a GPU at 0 KV is still a third full
    assert c["active_memory_utilization_mean"] > weights / hbm


class MoveOnce:
    """Moves every request it sees on ``a`` to ``b`` once, by ``mode``."""

    def __init__(self, mode: str) -> None:
        self.mode, self.moved = mode, set()

    def epoch(self, gpus, now) -> EpochPlan:
        by = {g.gpu_id: g for g in gpus}
        out = []
        a, b = sorted(by)[:2] if len(by) >= 2 else (None, None)
        for r in by[a].requests if a else ():
            if r.request_id not in self.moved:
                self.moved.add(r.request_id)
                out.append(Migration(migration_id(r.request_id, a, b, 0), r.request_id, r.model, a, b,
                                     r.kv_bytes, r.tokens, self.mode))  # fmt: skip
        return EpochPlan(tuple(out))


@pytest.mark.parametrize("mode", ["kv", "tokens"])
def test_kv_and_token_moves_complete_every_request(mode: str) -> None:
    from llmfleet.policies.dispatch import RoundRobin
    from llmfleet.policies.placement import InstancePlan
    from llmfleet.policies.request import Fcfs
    from llmfleet.sim.cost import CostBook
    from llmfleet.sim.simulator import Simulator

    spec = dataclasses.replace(SPEC, cluster=ClusterSpec.parse("2xA100-40GB"))
    plan = [InstancePlan("a", ("llama2-7b",), 1), InstancePlan("b", ("llama2-7b",), 1)]
    sim = Simulator(spec, plan, Fcfs, RoundRobin(), CostBook.build(spec.cluster.hw, spec.archs()))
    loop = MigrationLoop(MoveOnce(mode), None, epoch_s=0.5)
    loop.install(sim)
    wl = workload(n=30, rate=2.0)
    res = sim.run(wl.requests)
    assert all(r.done for r in res.records)
    moved = [r for r in res.records if r.moves]
    assert moved and loop.stats.executed == len(moved)
    st = loop.stats
    holding = len(moved) - st.queued_moves  # requests still queued move at once, whatever the mode
    assert holding > 0 and (st.kv_moves, st.token_moves) == ((holding, 0) if mode == "kv" else (0, holding))
    if mode == "kv":
        assert loop.stats.kv_bytes_moved > 0 and loop.stats.transfer_s_total > 0


def test_a_request_whose_kv_is_on_the_wire_is_seen_on_its_destination() -> None:
    """A KV move slower than an epoch: while its KV travels the request is in no engine, and the policy
    saw it nowhere (to Mell: a Depart, then an Allocate when it landed). Every unfinished request is
    now in exactly one GPU's state, a travelling one on its destination."""
    from llmfleet.policies.dispatch import RoundRobin
    from llmfleet.policies.placement import InstancePlan
    from llmfleet.policies.request import Fcfs
    from llmfleet.sim.cost import CostBook
    from llmfleet.sim.simulator import Simulator

    hw = dataclasses.replace(SPEC.cluster.hw, intra_node_bw=2e9, inter_node_bw=2e9)  # ~0.5 s per GB
    spec = dataclasses.replace(SPEC, cluster=ClusterSpec(2, hw))
    plan = [InstancePlan("a", ("llama2-7b",), 1), InstancePlan("b", ("llama2-7b",), 1)]
    sim = Simulator(spec, plan, Fcfs, RoundRobin(), CostBook.build(spec.cluster.hw, spec.archs()))
    mover = MoveOnce("kv")
    requests = workload(n=12, rate=4.0).requests
    request_ids = [r.request_id for r in requests]
    missing: list[str] = []
    travelling: list[str] = []

    class Spy:
        def epoch(self, gpus, now):
            listed = [r.request_id for g in gpus for r in g.requests]
            assert len(listed) == len(set(listed))  # on one GPU at most
            placed = {rid for rid in request_ids if sim.fleet.locate(rid) is not None}
            missing.extend(placed - set(listed))  # unfinished, yet on no GPU
            b = next((g for g in gpus if g.gpu_id == "b"), None)
            travelling.extend(
                r.request_id
                for r in (b.requests if b else ())
                if r.request_id not in sim.instances["b"].core.requests
            )
            return mover.epoch(gpus, now)

    loop = MigrationLoop(Spy(), None, epoch_s=0.05)
    loop.install(sim)
    res = sim.run(requests)
    assert all(r.done for r in res.records) and loop.stats.kv_moves > 0
    assert travelling and set(travelling) <= mover.moved
    assert missing == []


def test_states_count_whole_blocks_and_waiting_prompts() -> None:
    from llmfleet.policies.dispatch import RoundRobin
    from llmfleet.policies.placement import InstancePlan
    from llmfleet.policies.request import Fcfs
    from llmfleet.sim.cost import CostBook
    from llmfleet.sim.simulator import Simulator

    spec = dataclasses.replace(SPEC, cluster=ClusterSpec.parse("1xA100-40GB"))
    sim = Simulator(spec, [InstancePlan("a", ("llama2-7b",), 1)], Fcfs, RoundRobin(),
                    CostBook.build(spec.cluster.hw, spec.archs()))  # fmt: skip
    seen: list[list[GpuState]] = []

    class Spy:
        def epoch(self, gpus, now):
            seen.append(list(gpus))
            return EpochPlan()

    MigrationLoop(Spy(), None, epoch_s=0.05).install(sim)
    sim.run(workload(n=5, rate=50.0).requests)
    states = [g for epoch in seen for g in epoch if g.requests]
    assert states
    inst = sim.instances["a"]
    for g in states:
        assert g.capacity_bytes == inst.kv_capacity_bytes and g.active
        assert all(r.kv_bytes % inst.layout.block_bytes == 0 and r.kv_bytes > 0 for r in g.requests)


def test_bad_migration_settings_are_named() -> None:
    with pytest.raises(ValueError, match="unknown migration policy 'pack'"):
        bundle("jsq", "pack").validate()
    with pytest.raises(ValueError, match="unknown transfer policy 'teleport'"):
        bundle("jsq", "mell", transfer="teleport").validate()
    with pytest.raises(ValueError, match=r"migration\.epoch_s"):
        bundle("jsq", "mell", epoch_s=0).validate()
