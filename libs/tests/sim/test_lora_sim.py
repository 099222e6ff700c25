"""LoRA adapters in the simulator: instances of a base serve its adapters' services through a bounded
LRU adapter pool, adapter loads and the rank-r matmuls are charged, the prefix cache is keyed by
adapter, and the dispatch policies see each instance's adapter pools."""

from __future__ import annotations

import numpy as np
import pytest
from llmfleet.costmodel import hardware, model_arch
from llmfleet.costmodel.lora import LoraCost, adapter_bytes, adapter_pool_bytes
from llmfleet.engine_core import AdapterSlots
from llmfleet.policies.dispatch import make_dispatch_policy
from llmfleet.policies.migration.llumnix_lb import LlumnixBalance
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import Fcfs
from llmfleet.sim.bundle import PolicyBundle
from llmfleet.sim.cost import CostBook
from llmfleet.sim.memory import pool_layout
from llmfleet.sim.metrics import cluster_metrics
from llmfleet.sim.migration import MigrationLoop
from llmfleet.sim.run import simulate
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.types import Slo
from llmfleet.workload import Workload, WorkloadRequest, poisson

BASE = "llama2-7b"
SLO = Slo(ttft_s=1.0, tpot_s=0.1)


def adapter_services(n: int) -> tuple[SimService, ...]:
    return tuple(SimService(f"s{i}", BASE, SLO, adapter=f"a{i}") for i in range(n))


def workload(n_adapters: int, n: int = 300, rate: float = 20.0, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    times = poisson(rate, n=n, seed=seed)
    weights = 1.0 / np.arange(1, n_adapters + 1)
    pick = rng.choice(n_adapters, size=n, p=weights / weights.sum())
    return Workload(
        tuple(
            WorkloadRequest(
                f"r{i}", float(t), int(rng.integers(50, 400)), int(rng.integers(20, 200)), f"s{k}"
            )
            for i, (t, k) in enumerate(zip(times.tolist(), pick.tolist(), strict=True))
        )
    )


def simulator(dispatch: str, n_adapters: int = 8, max_loras: int = 2, instances: int = 2) -> Simulator:
    spec = SimSpec(
        ClusterSpec.parse("4xA100-80GB"), adapter_services(n_adapters), EngineSettings(max_loras=max_loras)
    )
    plan = [InstancePlan(f"e{i}", (BASE,), 1) for i in range(instances)]
    book = CostBook.build(hardware("A100-80GB"), spec.archs())
    return Simulator(spec, plan, Fcfs, make_dispatch_policy(dispatch), book)


def test_adapter_slots_are_lru_with_pins():
    s = AdapterSlots(2)
    assert s.acquire("a") is True and s.acquire("b") is True
    assert (s.slot("a"), s.slot("b")) == (0, 1)
    assert s.acquire("a") is False  # resident: a hit, and now the most recently used
    assert s.acquire("c") is None and not s.room("c")  # both pinned
    s.release("b")
    assert s.room("c") and s.acquire("c") is True  # evicts b, the unpinned one, into its slot
    assert s.resident == ("a", "c") and s.loads == 3 and s.evictions == 1
    assert (s.slot("c"), s.slot("b")) == (1, None)
    s.release("a")
    s.release("a")
    assert s.pins("a") == 0 and s.holds("a")


def test_lora_costs_scale_with_rows_adapters_and_rank():
    arch, hw = model_arch(BASE), hardware("a100-80gb")
    c = LoraCost(arch, hw)
    assert c.batch_seconds(0, 0) == 0.0
    assert c.batch_seconds(64, 8) > c.batch_seconds(64, 1) > 0
    assert c.batch_seconds(8192, 1) > c.batch_seconds(64, 1)
    assert LoraCost(arch, hw, tp=2).load_seconds() < c.load_seconds()
    assert c.load_seconds(8) < c.load_seconds(16)
    assert adapter_bytes(arch, 16) == 2 * adapter_bytes(arch, 8)
    # the pool's memory comes out of the KV pool
    off = pool_layout(hw, 1, [arch], EngineSettings())
    on = pool_layout(hw, 1, [arch], EngineSettings(max_loras=8))
    assert off.kv_bytes - on.kv_bytes == adapter_pool_bytes(arch, 8)


@pytest.mark.parametrize("dispatch", ["lora_affinity", "lora_llmd", "jsq", "round_robin"])
def test_every_request_of_an_adapter_is_served_on_its_base(dispatch):
    sim = simulator(dispatch)
    res = sim.run(workload(8).requests, strict_services=True)
    assert all(r.done and not r.failed for r in res.records)
    assert all(r.adapter == f"a{r.service[1:]}" and r.model == BASE for r in res.records)
    loads = sum(d["adapter_loads"] for d in res.instances)
    assert loads >= 8  # each adapter loaded at least once
    assert cluster_metrics(res)["adapter_loads"] == loads  # the report's, as the engines' /metrics count
    for inst in sim.instances.values():
        for slots in inst.adapter_slots.values():
            assert len(slots.resident) <= 2 and all(slots.pins(a) == 0 for a in slots.resident)
        assert not inst.core.requests


def test_affinity_loads_adapters_less_often_than_round_robin():
    loads = {}
    for dispatch in ("lora_affinity", "round_robin"):
        res = simulator(dispatch, n_adapters=4, max_loras=2).run(workload(4).requests, strict_services=True)
        loads[dispatch] = sum(d["adapter_loads"] for d in res.instances)
    assert loads["lora_affinity"] < loads["round_robin"]


def test_candidates_carry_adapter_pools_and_list_adapters():
    sim = simulator("lora_affinity", n_adapters=3)
    wl = workload(3, n=5, rate=1000.0)
    sim.run(wl.requests, strict_services=True)
    cands = sim.candidates()
    assert all(set(c.models) == {BASE, "a0", "a1", "a2"} for c in cands)
    assert all(c.adapter_pool(BASE) is not None and c.adapter_pool(BASE).slots == 2 for c in cands)
    assert sum(len(c.adapter_pools[0].resident) for c in cands) >= 1


def test_requests_wait_for_a_slot_when_every_slot_is_pinned():
    sim = simulator("round_robin", n_adapters=4, max_loras=1, instances=1)
    reqs = tuple(WorkloadRequest(f"r{i}", 0.001 * i, 100, 50, f"s{i}") for i in range(4))
    res = sim.run(reqs, strict_services=True)
    assert all(r.done for r in res.records)
    firsts = sorted(r.first_token_s for r in res.records)
    # one adapter at a time: each request starts after the one before it finished
    finishes = sorted(r.finish_s for r in res.records)
    assert all(f >= e for f, e in zip(firsts[1:], finishes[:-1], strict=True))
    assert res.instances[0]["adapter_loads"] == 4


def test_adapter_requests_cost_more_than_base_requests():
    reqs = tuple(WorkloadRequest(f"r{i}", 0.0, 200, 100, f"s{i % 4}") for i in range(16))
    lora = simulator("jsq", n_adapters=4, max_loras=4, instances=1).run(reqs, strict_services=True)
    plain_spec = SimSpec(
        ClusterSpec.parse("1xA100-80GB"),
        tuple(SimService(f"s{i}", BASE, SLO) for i in range(4)),
        EngineSettings(max_loras=4),
    )
    plain = Simulator(
        plain_spec,
        [InstancePlan("e0", (BASE,), 1)],
        Fcfs,
        make_dispatch_policy("jsq"),
        CostBook.build(hardware("A100-80GB"), plain_spec.archs()),
    ).run(reqs, strict_services=True)
    assert lora.end_s > plain.end_s


def test_services_of_adapters_need_adapter_slots():
    spec = SimSpec(ClusterSpec.parse("1xA100-80GB"), adapter_services(2))
    book = CostBook.build(hardware("A100-80GB"), spec.archs())
    with pytest.raises(ValueError, match="max_loras"):
        Simulator(spec, [InstancePlan("e0", (BASE,), 1)], Fcfs, make_dispatch_policy("jsq"), book)
    with pytest.raises(ValueError, match="max_lora_rank"):
        SimSpec(ClusterSpec.parse("1xA100-80GB"), (SimService("s", BASE, adapter="a", lora_rank=64),))


def test_a_cluster_file_with_adapters_simulates_them_on_their_base():
    from llmfleet.config import ClusterConfig
    from llmfleet.sim.spec import from_cluster_config

    config = ClusterConfig.model_validate(
        {
            "services": {"chat": {"model": "chat-lora"}, "plain": {"model": "base"}},
            "models": {
                "base": {"source": "tiny://llama", "sim_model": BASE},
                "chat-lora": {"base": "base", "adapter": "/adapters/chat"},
            },
            "placement": {"policy": "static"},
            "engines": {"e0": {"models": ["base"], "max_loras": 2, "max_lora_rank": 8}},
        }
    )
    services, engine = from_cluster_config(config)
    by_name = {s.name: s for s in services}
    assert (by_name["chat"].model, by_name["chat"].adapter) == (BASE, "chat-lora")
    assert (by_name["plain"].model, by_name["plain"].adapter) == (BASE, "")
    assert (engine.max_loras, engine.max_lora_rank) == (2, 8)
    assert by_name["chat"].lora_rank == 8
    SimSpec(ClusterSpec.parse("1xA100-80GB"), services, engine)  # a valid simulation


def test_an_adapter_entry_of_the_emulated_pool_declares_its_rank():
    from llmfleet.config import ClusterConfig
    from llmfleet.sim.spec import from_cluster_config

    config = ClusterConfig.model_validate(
        {
            "services": {"a": {"model": "a4"}, "b": {"model": "b"}},
            "models": {
                BASE: {"source": f"emulated://{BASE}"},
                "a4": {"base": BASE, "adapter": "emulated://r4"},  # as the emulated engines read it
                "b": {"base": BASE, "adapter": "/adapters/b"},
            },
            "placement": {"policy": "colocate_all"},
            "emulated": {"count": 2, "engine": {"max_loras": 2, "max_lora_rank": 16}},
        }
    )
    services, _ = from_cluster_config(config)
    assert {s.name: s.lora_rank for s in services} == {"a": 4, "b": 16}


def test_the_prefix_cache_is_keyed_by_adapter():
    # one prompt (the same seeded segment) sent twice by one adapter, then by another, one at a time
    reqs = tuple(
        WorkloadRequest(f"r{i}", 10.0 * i, 512, 4, f"s{k}", parts=((7, 512),))
        for i, k in enumerate((0, 0, 1))
    )
    sim = simulator("round_robin", n_adapters=2, max_loras=2, instances=1)
    res = sim.run(reqs, strict_services=True)
    hits = res.instances[0]["prefix_hits"]
    assert hits > 0  # the second request of a0 found the first one's blocks
    sim2 = simulator("round_robin", n_adapters=2, max_loras=2, instances=1)
    res2 = sim2.run(reqs[:2], strict_services=True)
    assert res2.instances[0]["prefix_hits"] == hits  # a1's request found none of a0's


def test_the_simulators_planner_reserves_the_engines_adapter_pool():
    """The first plan of a simulation prices the adapter pool its engines reserve: Llama-2-7B fits one L4
    bare, not beside 32 slots of rank 64 (9.5 GiB), so the same planner gives it two GPUs."""

    def first_plan(engine: EngineSettings) -> list[InstancePlan]:
        spec = SimSpec(ClusterSpec.parse("4xL4"), adapter_services(2), engine)
        return simulate(spec, workload(2, n=20, rate=2.0), PolicyBundle("x", "dedicated_even")).plan

    assert {p.tp for p in first_plan(EngineSettings(max_loras=2, max_lora_rank=16))} == {1}
    assert {p.tp for p in first_plan(EngineSettings(max_loras=32, max_lora_rank=64))} == {2}


def test_migration_moves_an_adapters_request_to_an_instance_serving_the_adapter():
    """An instance with LoRA on lists its bases' adapters beside them in the policy's input (as an
    engine's node record does), so the policy moves adapter requests as it balances the bare base's;
    each takes its adapter's slot where it lands, and every request completes."""
    sim = simulator("round_robin", n_adapters=3, max_loras=2)
    loop = MigrationLoop(LlumnixBalance())
    loop.install(sim)
    assert [g.models for g in loop.gpu_states(sim)] == [(BASE, "a0", "a1", "a2")] * 2

    def run(adapters: bool) -> dict:
        services = tuple(
            SimService(f"s{i}", BASE, SLO, adapter=f"a{i}" if adapters else "") for i in range(2)
        )
        spec = SimSpec(ClusterSpec.parse("2xA100-80GB"), services, EngineSettings(max_loras=2))
        rng = np.random.default_rng(0)
        wl = Workload(
            tuple(
                WorkloadRequest(
                    f"r{i}", float(t), int(rng.integers(50, 400)), int(rng.integers(200, 800)), f"s{i % 2}"
                )
                for i, t in enumerate(poisson(20.0, n=300, seed=0).tolist())
            )
        )
        plan = [InstancePlan(f"e{i}", (BASE,), 1) for i in range(2)]
        migration = {"policy": "llumnix_lb", "options": {"threshold": 0.0}}
        return simulate(
            spec, wl, PolicyBundle("x", None, "power_of_two", migration=migration), plan=plan
        ).report

    for adapters in (False, True):
        report = run(adapters)
        assert report["migration"]["executed"] > 0 and report["migration"]["skipped"] == 0
        assert (report["overall"]["completed"], report["overall"]["failed"]) == (300, 0)
