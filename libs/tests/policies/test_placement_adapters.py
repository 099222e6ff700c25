"""Placement prices LoRA adapters: the adapter pool's memory on the base's instance and the batched LoRA
computation of each step (``policies/placement/adapter_costs.py``, the cost model's formulas)."""

from __future__ import annotations

import pytest
from llmfleet.costmodel import hardware, model_arch
from llmfleet.costmodel.lora import LoraCost, adapter_pool_bytes
from llmfleet.kvblocks import BlockAllocator
from llmfleet.policies.placement import (
    AladdinPlanner,
    AladdinWorkers,
    ColocateAll,
    DedicatedEven,
    GpuPool,
    PlacementContext,
    PlacementInfeasible,
    PlanScore,
    SeaLLMOptions,
    SeaLLMPlacement,
    ServiceLoad,
)
from llmfleet.policies.placement.adapter_costs import (
    AdapterTraffic,
    InstanceMemory,
    adapter_traffic,
    lora_step_seconds,
)
from llmfleet.policies.placement.aladdin_workers import kv_capacity, kv_room
from llmfleet.sim.memory import DoesNotFit, pool_layout
from llmfleet.sim.spec import EngineSettings
from llmfleet.types import Slo


class EvenEvaluator:
    """Scores every plan alike (the memory fit is what these tests look at)."""

    parallelism = 1

    def evaluate(self, plans):
        return [PlanScore(1.0, 1.0, {}, {}, 1) for _ in plans]

    def close(self) -> None:
        pass


SLO = Slo(ttft_s=2.0, tpot_s=0.1)
SEVEN_B = "llama2-7b"


def zipf_adapters(rate: float, n: int = 32) -> list[ServiceLoad]:
    """``n`` adapter services of one 7B base, Zipf (exponent 1) shares of ``rate``."""
    w = [1 / (i + 1) for i in range(n)]
    return [
        ServiceLoad(f"s{i:02d}", SEVEN_B, rate * x / sum(w), 512, 128, slo=SLO, adapter=f"a{i:02d}")
        for i, x in enumerate(w)
    ]


def bare(rate: float) -> list[ServiceLoad]:
    return [ServiceLoad("base", SEVEN_B, rate, 512, 128, slo=SLO)]


LORA = GpuPool("a100-80gb", 256, 8, adapter_slots=8, max_lora_rank=16)
PLAIN = GpuPool("a100-80gb", 256, 8)


def test_adapter_traffic_counts_adapters_and_their_share_of_the_base() -> None:
    loads = [
        ServiceLoad("a", SEVEN_B, 3.0, adapter="x"),
        ServiceLoad("b", SEVEN_B, 1.0, adapter="y"),
        ServiceLoad("c", SEVEN_B, 4.0),
        ServiceLoad("d", SEVEN_B, 0.0, adapter="idle"),
        ServiceLoad("e", "llama2-13b", 2.0),
    ]
    assert adapter_traffic(loads) == {SEVEN_B: AdapterTraffic(2, 0.5)}  # no adapter of the 13B
    cold = [ServiceLoad("a", SEVEN_B, adapter="x"), ServiceLoad("b", SEVEN_B)]  # no traffic: by count
    assert adapter_traffic(cold) == {SEVEN_B: AdapterTraffic(1, 0.5)}


def test_the_step_charge_is_the_cost_models_batch_seconds() -> None:
    arch, hw = model_arch(SEVEN_B), hardware("a100-80gb")
    memory = InstanceMemory(hw, adapter_slots=8, max_lora_rank=16)
    # 64 rows, half of them adapter rows over 32 adapters with traffic: 8 distinct (the slots)
    got = lora_step_seconds(arch, memory, AdapterTraffic(32, 0.5), 1, 64)
    assert got == LoraCost(arch, hw, 1, 16).batch_seconds(32, 8)
    assert got > 0
    assert lora_step_seconds(arch, InstanceMemory(hw), AdapterTraffic(32, 0.5), 1, 64) == 0.0  # LoRA off
    assert memory.pool_bytes(arch) == adapter_pool_bytes(arch, 8, 16)


def test_a_base_serving_many_adapters_needs_more_workers_than_the_bare_base() -> None:
    """Aladdin's worker throughput (Eq. 6) pays the adapter pool's memory and the LoRA matmuls: the same
    traffic as 32 Zipf adapters needs at least as many workers at every rate, and more at some."""
    sizing = AladdinWorkers()
    with_adapters = sizing.worker_config(LORA, zipf_adapters(40))[SEVEN_B]["throughput"]
    pool_only = sizing.worker_config(LORA, bare(40))[SEVEN_B]["throughput"]  # pool reserved, no rows
    plain = sizing.worker_config(PLAIN, bare(40))[SEVEN_B]["throughput"]
    assert with_adapters < pool_only < plain
    more = 0
    for rate in range(10, 410, 10):
        lora_workers = len(AladdinPlanner().place(LORA, zipf_adapters(rate)))
        bare_workers = len(AladdinPlanner().place(PLAIN, bare(rate)))
        assert lora_workers >= bare_workers, rate
        more += lora_workers > bare_workers
    assert more > 0


# llama2-7b on one L4 (22.4 GiB): 12.6 GiB of weights; 16 slots of rank 64 are a 4.8 GiB pool, 32 a 9.5 GiB one
L4 = "l4"


def test_dedicated_and_colocated_plans_fit_the_adapter_pool_with_the_weights() -> None:
    loads = zipf_adapters(4.0)
    plain = DedicatedEven().place(GpuPool(L4, 4, 4), loads)
    big_pool = DedicatedEven().place(GpuPool(L4, 4, 4, adapter_slots=32, max_lora_rank=64), loads)
    assert {p.tp for p in plain} == {1} and {p.tp for p in big_pool} == {2}
    assert {p.tp for p in ColocateAll().place(GpuPool(L4, 4, 4, 32, 64), loads)} == {2}
    with pytest.raises(PlacementInfeasible, match="LoRA adapter pool"):
        DedicatedEven().place(GpuPool(L4, 4, 1, adapter_slots=32, max_lora_rank=64), loads)


def test_seallm_refuses_a_group_whose_adapter_pool_leaves_no_kv_for_a_request() -> None:
    """CanAllocate: one request of the 7B's longest context (4,096 tokens, 2 GiB of KV) fits the ~7.3 GiB
    KV pool one L4 keeps for the bare base, not the ~1.3 GiB left beside a 6 GiB adapter pool."""
    loads = [ServiceLoad("A", SEVEN_B, 1.0, 400, 200, slo=SLO, adapter="a0")]
    options = SeaLLMOptions(tp_candidates=(1,))

    def plan(gpus: GpuPool):
        ctx = PlacementContext(evaluator=EvenEvaluator())
        return SeaLLMPlacement(options).place(gpus, loads, ctx)

    assert [p.models for p in plan(GpuPool(L4, 1, 1))] == [(SEVEN_B,)]
    assert [p.models for p in plan(GpuPool(L4, 1, 1, adapter_slots=12, max_lora_rank=64))] == [(SEVEN_B,)]
    with pytest.raises(PlacementInfeasible, match="no service fits"):
        plan(GpuPool(L4, 1, 1, adapter_slots=20, max_lora_rank=64))


@pytest.mark.parametrize(
    ("gpu", "tp", "models", "slots"),
    [
        ("a100-80gb", 2, ("llama2-70b", "llama2-7b"), 0),  # ~1 GB of KV: refused
        ("a100-80gb", 2, ("llama2-70b", "opt-6.7b"), 0),
        ("a100-80gb", 4, ("llama2-70b", "opt-6.7b"), 0),
        ("a100-80gb", 1, ("llama2-13b", "llama2-7b"), 0),
        ("l4", 1, ("llama2-7b",), 0),
        ("l4", 1, ("llama2-7b",), 20),  # the adapter pool leaves too little
    ],
)
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"block_tokens": 32, "watermark": 0.2, "max_batch_requests": 64, "mem_fraction": 0.8},
        {"kv_bytes": 2**30},  # the simulator's override: every pool this size, whatever it hosts
        {"kv_bytes": 3 * 2**30},
    ],
    ids=["defaults", "tuned", "1GiB", "3GiB"],
)
def test_holds_longest_counts_as_the_engines_allocator(gpu, tp, models, slots, settings) -> None:
    """``InstanceMemory.holds_longest`` says yes exactly when the allocator the engines build for that
    pool (merged blocks, watermark) admits one sequence of each model's longest context, at the
    defaults and at engine settings that change the pool and its blocks."""
    archs = [model_arch(m) for m in models]
    eng = EngineSettings(max_loras=slots, max_lora_rank=64, **settings)
    pool = GpuPool(gpu, 8, 8, slots, 64, eng.limits, eng.mem_fraction, eng.kv_bytes)
    memory = InstanceMemory.of(pool)
    try:
        layout = pool_layout(hardware(gpu), tp, archs, eng)
    except DoesNotFit:  # not one block
        assert not memory.holds_longest(tp, archs)
        return
    assert memory.kv_bytes(tp, archs) == layout.kv_bytes
    alloc = BlockAllocator(layout.num_blocks, layout.block_bytes, eng.watermark)
    for a in archs:
        alloc.register_model(a.name, a.kv_shape)
    engine_says = all(alloc.can_allocate(a.name, a.max_context) for a in archs)
    assert memory.holds_longest(tp, archs) == engine_says


def test_planners_read_the_engines_memory_settings() -> None:
    """A pool whose engines keep less of the GPU (``mem_fraction``) or a larger watermark has less KV
    room: Llama-2-7B fits its longest context on one L4 at the defaults, not at 0.65 of it, and
    Aladdin's M shrinks by the same bytes as the engines' pool."""
    seven = model_arch(SEVEN_B)
    assert InstanceMemory.of(GpuPool(L4, 1, 1)).holds_longest(1, [seven])
    tight = GpuPool(L4, 1, 1, mem_fraction=0.65)
    assert not InstanceMemory.of(tight).holds_longest(1, [seven])
    eng = EngineSettings(mem_fraction=0.65)
    assert (
        kv_room(seven, hardware(L4), 1, memory=InstanceMemory.of(tight))
        == pool_layout(hardware(L4), 1, [seven], eng).kv_bytes
    )
    assert kv_room(seven, hardware(L4), 1) == kv_capacity(seven, hardware(L4), 1)
