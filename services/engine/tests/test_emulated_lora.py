"""LoRA adapters on the emulated backend: an adapter service is served on its base with the simulator's
pool rule (LRU, pins), the load report lists the base's adapters as the native engine's does, and
adapter loads, adapter rows and the pool's memory are priced by ``costmodel.lora``."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from llmfleet.costmodel import hardware, model_arch
from llmfleet.costmodel.lora import LoraCost, adapter_pool_bytes
from llmfleet.engine_core import AdapterSlots
from llmfleet.metrics.engine import EngineMetrics
from llmfleet.types import ModelSpec
from llmfleet_engine.emulated import EmulatedConfig, EmulatedExecutor
from llmfleet_engine.emulated.adapters import adapter_rank, emulated_adapter
from llmfleet_engine.lora import AdapterError
from llmfleet_engine.servicer import snapshot_to_proto
from llmfleet_engine.validation import GenerationRequest, build_request
from prometheus_client import CollectorRegistry, generate_latest

BASE = "llama2-7b"
ADAPTERS = {"a0": "emulated://r8", "a1": "/adapters/a1", "a2": "emulated://r16"}


def make(max_loras: int, max_lora_rank: int = 16) -> EmulatedExecutor:
    ex = EmulatedExecutor(
        EmulatedConfig(
            hardware="a100-80gb", sim_models={BASE: BASE}, max_loras=max_loras, max_lora_rank=max_lora_rank
        )
    )
    ex.host.load(ModelSpec(BASE, f"emulated://{BASE}"))
    for name, path in ADAPTERS.items() if max_loras else ():
        ex.adapters.add(name, BASE, path)
    return ex


def request(ex: EmulatedExecutor, model: str, rid: str, max_tokens: int = 3) -> GenerationRequest:
    base = ex.host.models[BASE]
    return dataclasses.replace(
        build_request(base, "t1 t2 t3", request_id=rid, max_tokens=max_tokens), model=model
    )


async def test_an_adapter_service_is_served_with_the_simulators_lru_and_listed_in_the_load_report():
    ex = make(max_loras=2)
    try:
        assert set(ex.adapters.serving((BASE,))) == {BASE, *ADAPTERS}  # advertised with the base
        order = ["a0", "a1", "a0", "a2", BASE]
        sim = AdapterSlots(2)
        for i, name in enumerate(order):
            chunks = await asyncio.wait_for(ex.submit(request(ex, name, f"r{i}")).collect(), 30)
            assert sum(len(c.token_ids) for c in chunks) == 3
            if name != BASE:
                sim.acquire(name)
                sim.release(name)
            assert ex.adapters.resident(BASE) == list(sim.resident)
        assert ex.adapters.resident(BASE) == ["a0", "a2"]  # a1, least recently used, was evicted
        (load,) = ex.load_snapshot().models
        assert (load.model, load.adapters, load.adapter_loads, load.adapter_slots) == (
            BASE,
            ("a0", "a2"),
            3,
            2,
        )
        (msg,) = snapshot_to_proto(ex.load_snapshot(), "e0").models
        assert (list(msg.adapters), msg.adapter_loads, msg.adapter_slots) == (["a0", "a2"], 3, 2)
        registry = CollectorRegistry()  # the loads on /metrics, to be compared with the simulator's
        ex.attach_metrics(EngineMetrics(registry))
        assert (
            f'llmfleet_lora_adapter_loads_total{{model_name="{BASE}"}} 3.0'
            in generate_latest(registry).decode()
        )
    finally:
        await ex.aclose()


async def test_a_request_waits_while_other_adapters_hold_every_slot():
    ex = make(max_loras=1)
    try:
        held = ex.submit(request(ex, "a0", "long", max_tokens=50))
        other = ex.submit(request(ex, "a1", "other"))  # waits for a0's slot instead of being refused
        base = ex.submit(request(ex, BASE, "base"))  # the base goes ahead of it
        done = [await asyncio.wait_for(s.collect(), 30) for s in (held, other, base)]
        assert [sum(len(c.token_ids) for c in d) for d in done] == [50, 3, 3]
        assert done[2][-1].usage.ttft_s < done[0][-1].usage.latency_s <= done[1][-1].usage.ttft_s
        assert ex.adapters.resident(BASE) == ["a1"]
    finally:
        await ex.aclose()


async def test_loads_and_adapter_rows_are_priced_as_the_simulator_prices_them():
    ex = make(max_loras=4)
    try:
        pricer = ex.host.runner(BASE)
        pool = pricer.lora
        assert pool is not None
        cost = LoraCost(model_arch(BASE), hardware("a100-80gb"), 1, 16)
        assert pool.cost == cost
        taken: list[float] = []
        take = pool.take_load_debt

        def taking() -> float:  # the load seconds each step pays
            taken.append(take())
            return taken[-1]

        pool.take_load_debt = taking  # type: ignore[method-assign]
        # a0 rank 8 (emulated://r8), loaded; a0 again resident; a1 has no rank in its entry: the pool's 16
        for rid, name in [("p0", "a0"), ("p1", "a0"), ("p2", "a1")]:
            await asyncio.wait_for(ex.submit(request(ex, name, rid)).collect(), 30)
        assert sum(taken) == pytest.approx(cost.load_seconds(8) + cost.load_seconds(16))
        assert pool.take_load_debt() == 0.0  # the steps that admitted them paid it
    finally:
        await ex.aclose()


def test_the_adapter_pool_is_reserved_with_its_base():
    without, with_pool = make(max_loras=0), make(max_loras=8)
    try:
        reserved = without.host.kv_capacity_bytes - with_pool.host.kv_capacity_bytes
        want = adapter_pool_bytes(model_arch(BASE), 8, 16)
        assert abs(reserved - want) <= with_pool.plan.block_bytes
    finally:
        without.close()
        with_pool.close()


def test_the_emulated_loader_reads_no_files_and_checks_the_rank():
    assert adapter_rank("emulated://r4", 16) == 4
    assert adapter_rank("/some/dir", 16) == 16
    a = emulated_adapter("x", "emulated://r4", None, max_rank=8, targets=frozenset())
    assert (a.name, a.rank, a.weights) == ("x", 4, {})
    with pytest.raises(AdapterError, match="rank 32"):
        emulated_adapter("x", "emulated://r32", None, max_rank=16, targets=frozenset())
