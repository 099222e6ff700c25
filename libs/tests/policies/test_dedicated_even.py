import pytest
from llmfleet.costmodel.models import model_arch
from llmfleet.policies.placement import (
    POLICIES,
    ColocateAll,
    DedicatedEven,
    GpuPool,
    PlacementInfeasible,
    ServiceLoad,
    make_placement_policy,
)
from llmfleet.policies.placement.dedicated_even import smallest_tp

GIB = 1 << 30
A100 = GpuPool("a100-80gb", 32)


def svc(name, model, rate=1.0):
    return ServiceLoad(name, model, rate_rps=rate)


LLAMAS = [svc("s7", "llama2-7b", 5.0), svc("s13", "llama2-13b", 3.0), svc("s70", "llama2-70b", 1.0)]


def gpus_used(plans):
    return sum(p.tp for p in plans)


def test_weights_used_by_the_hand_computation():
    # fp16 weights: 7B 12.55 GiB, 13B 24.24 GiB, 70B 128.48 GiB; 90 % of an 80 GiB A100 is 72 GiB
    assert 12 * GIB < model_arch("llama2-7b").weight_bytes < 13 * GIB
    assert 24 * GIB < model_arch("llama2-13b").weight_bytes < 25 * GIB
    assert 128 * GIB < model_arch("llama2-70b").weight_bytes < 129 * GIB


def test_dedicated_even_on_32_a100_80gb():
    plans = DedicatedEven().place(A100, LLAMAS)
    by_model = {}
    for p in plans:
        assert len(p.models) == 1
        by_model.setdefault(p.models[0], []).append(p)
    # 32 // 3 = 10 each; 2 leftovers to the busiest models (7B, 13B): 11, 11, 10 GPUs
    # TP: 7B and 13B fit one GPU (<= 72 GiB); 70B needs 2 (128.5 <= 144 GiB): 10 // 2 = 5 instances
    assert {m: (len(ps), {p.tp for p in ps}) for m, ps in by_model.items()} == {
        "llama2-7b": (11, {1}),
        "llama2-13b": (11, {1}),
        "llama2-70b": (5, {2}),
    }
    assert gpus_used(plans) == 32
    assert [p.instance_id for p in by_model["llama2-70b"]] == [f"llama2-70b-{i}" for i in range(5)]
    assert [p.models[0] for p in plans] == sorted(p.models[0] for p in plans)  # grouped by model name
    assert len({p.instance_id for p in plans}) == len(plans)


def test_leftovers_follow_request_rate_then_name():
    busy70 = [svc("s7", "llama2-7b", 1.0), svc("s13", "llama2-13b", 1.0), svc("s70", "llama2-70b", 9.0)]
    plans = DedicatedEven().place(A100, busy70)
    count = {
        m: sum(p.tp for p in plans if p.models == (m,)) for m in ("llama2-7b", "llama2-13b", "llama2-70b")
    }
    # 70B gets 11 GPUs (5 instances of 2, one idle); the 13B/7B tie on rate goes to the name "llama2-13b"
    assert count == {"llama2-7b": 10, "llama2-13b": 11, "llama2-70b": 10}
    assert gpus_used(plans) == 31
    # two services of one model: rates add up (7B: 2 + 2 = 4 > 13B's 3)
    two = [svc("x", "llama2-7b", 2.0), svc("y", "llama2-7b", 2.0), svc("z", "llama2-13b", 3.0)]
    plans = DedicatedEven().place(GpuPool("a100-80gb", 5), two)
    assert [p.instance_id for p in plans] == [
        "llama2-13b-0",
        "llama2-13b-1",
        *[f"llama2-7b-{i}" for i in range(3)],
    ]


def test_the_kv_fraction_changes_tp():
    assert smallest_tp(128.5 * GIB, 80 * GIB, 8, 0.5) == 4  # 128.5 > 80 but <= 160 GiB
    assert smallest_tp(100 * GIB, 80 * GIB, 8, 0.0) == 2
    assert smallest_tp(100 * GIB, 80 * GIB, 1, 0.0) is None
    assert smallest_tp(72 * GIB, 80 * GIB, 8, 0.1) == 1  # the boundary itself fits


def test_dedicated_even_infeasible_cases_name_the_model():
    # 4 GPUs: 2 + 1 + 1; with the lowest rate 70B gets 1 GPU but needs tp=2
    with pytest.raises(PlacementInfeasible, match=r"llama2-70b.*gets 1 of 4.*tp=2"):
        DedicatedEven().place(GpuPool("a100-80gb", 4), LLAMAS)
    busy70 = [svc("s7", "llama2-7b", 1.0), svc("s13", "llama2-13b", 1.0), svc("s70", "llama2-70b", 9.0)]
    plans = DedicatedEven().place(GpuPool("a100-80gb", 4), busy70)  # now 70B gets the leftover
    assert [(p.instance_id, p.tp) for p in plans] == [
        ("llama2-13b-0", 1),
        ("llama2-70b-0", 2),
        ("llama2-7b-0", 1),
    ]
    with pytest.raises(PlacementInfeasible, match=r"llama2-70b.*1 a100-80gb"):
        DedicatedEven().place(GpuPool("a100-80gb", 32, gpus_per_node=1), LLAMAS)
    assert DedicatedEven().place(A100, []) == []


def test_colocate_all():
    plans = ColocateAll().place(A100, LLAMAS)
    # 165.3 GiB in all: > 144 (tp 2), <= 288 (tp 4) -> 8 instances of 4 GPUs, each with all three models
    assert [(p.instance_id, p.tp) for p in plans] == [(f"colocate-{i}", 4) for i in range(8)]
    assert {p.models for p in plans} == {("llama2-13b", "llama2-70b", "llama2-7b")}
    small = ColocateAll().place(A100, LLAMAS[:2])  # 36.8 GiB: one GPU each
    assert len(small) == 32 and {p.tp for p in small} == {1}
    assert len(ColocateAll().place(GpuPool("a100-80gb", 18), LLAMAS)) == 4  # 2 GPUs idle
    assert ColocateAll().place(A100, []) == []


def test_colocate_all_infeasible():
    with pytest.raises(PlacementInfeasible, match="pool has 2 GPUs"):
        ColocateAll().place(GpuPool("a100-80gb", 2), LLAMAS)
    with pytest.raises(PlacementInfeasible, match="llama2-70b"):
        ColocateAll().place(GpuPool("a100-80gb", 32, gpus_per_node=2), LLAMAS)


def test_registry():
    assert {"dedicated_even", "colocate_all"} <= set(POLICIES)
    p = make_placement_policy("colocate_all")
    assert isinstance(p, ColocateAll) and p.name == "colocate_all"
    with pytest.raises(ValueError, match=r"unknown placement policy 'x'.*colocate_all.*dedicated_even"):
        make_placement_policy("x")
    with pytest.raises(ValueError, match="bad options for placement policy 'colocate_all'"):
        make_placement_policy("colocate_all", tp=8)
