"""Aladdin's fleet planner (N_g* + Eq. 7 worker count + scale-out) and plan → engine assignment."""

from __future__ import annotations

import math

import pytest
from llmfleet.costmodel import hardware
from llmfleet.policies.placement import (
    AladdinOptions,
    AladdinPlanner,
    EngineSlot,
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementInfeasible,
    ServiceLoad,
    assign_plan,
    gpus_in_use,
    make_placement_policy,
    moves,
)
from llmfleet.types import Slo

POOL = GpuPool("a100-80gb", 32, 8)


def svc(name: str, model: str, rate: float) -> ServiceLoad:
    return ServiceLoad(name, model, rate, 200, 200)


def test_worker_count_follows_eq7_per_model():
    p = AladdinPlanner(
        AladdinOptions(
            k5={"llama2-7b": 0.5, "llama2-13b": 0.25}, c5=1.0, t_dec={"llama2-7b": 0.015, "llama2-13b": 0.03}
        )
    )
    plan = p.place(
        POOL, [svc("a", "llama2-7b", 3.0), svc("a2", "llama2-7b", 1.0), svc("b", "llama2-13b", 4.0)]
    )
    count = {m: sum(1 for x in plan if x.models == (m,)) for m in ("llama2-7b", "llama2-13b")}
    assert count == {"llama2-7b": 3, "llama2-13b": 2}  # ⌈0.5·4 + 1⌉ = 3, ⌈0.25·4 + 1⌉ = 2
    assert p.last_counts == count and "⌈k5·4.00 + c5⌉ → 3" in p.last_reason
    assert all(x.tp == 1 for x in plan)  # N_g* on the default cost source's A100 (see test_aladdin)


def test_scale_in_as_rate_falls_never_below_min_workers():
    p = AladdinPlanner(AladdinOptions(k5=1.0, c5=0.0, min_workers=2, t_dec=0.015))
    assert len(p.place(POOL, [svc("a", "llama2-7b", 3.0)])) == 3
    assert len(p.place(POOL, [svc("a", "llama2-7b", 0.0)])) == 2


def test_scale_out_when_best_fit_finds_no_feasible_worker():
    p = AladdinPlanner(AladdinOptions(k5=0.1, t_dec=0.015))
    current = tuple(InstancePlan(f"llama2-7b-{i}", ("llama2-7b",), 4) for i in range(2))
    ctx = PlacementContext(current=current, infeasible={"llama2-7b": 5})
    plan = p.place(POOL, [svc("a", "llama2-7b", 1.0)], ctx)  # Eq. 7 says 1, dispatch overflowed on 2
    assert len(plan) == 3 and "scale-out: 5 requests" in p.last_reason


def test_capped_by_the_pool_then_infeasible():
    p = AladdinPlanner(AladdinOptions(k5=10.0, t_dec={"llama2-7b": 0.015, "llama2-13b": 0.03}))
    plan = p.place(POOL, [svc("a", "llama2-7b", 5.0), svc("b", "llama2-13b", 1.0)])
    assert sum(x.tp for x in plan) == 32 and "capped by the pool" in p.last_reason
    assert {m for x in plan for m in x.models} == {"llama2-7b", "llama2-13b"}  # each keeps a worker
    with pytest.raises(PlacementInfeasible, match="needs 5 GPUs"):
        p.place(GpuPool("a100-80gb", 4, 8), [svc("a", "llama2-7b", 1.0), svc("b", "llama2-70b", 1.0)])
    with pytest.raises(ValueError, match="min_workers"):
        AladdinPlanner(AladdinOptions(min_workers=0))


def test_default_slope_is_the_eq6_worker_capacity():
    """Without k5 the count is ⌈r·l̄_out / (N*·T_max(N*))⌉ (a worker's SLO-bound decode capacity)."""
    p = make_placement_policy("aladdin", t_dec=0.015)
    big = GpuPool("a100-80gb", 4096, 8)
    for rate in (20.0, 2000.0, 20000.0):
        services = [svc("a", "llama2-7b", rate)]
        cfg = p.sizing.worker_config(big, services)["llama2-7b"]
        want = math.ceil(rate * 200 / (cfg["throughput"] * cfg["tp"]) - 1e-9)
        assert len(p.place(big, services)) == max(1, want)


def test_assign_keeps_exact_matches_and_moves_least():
    pool = [
        EngineSlot("e0", 1, ("m1",)),
        EngineSlot("e1", 1, ("m2",)),
        EngineSlot("e2", 1, ("m1", "m2")),
        EngineSlot("e3", 1, ()),
    ]
    plan = [InstancePlan("x", ("m2",), 1), InstancePlan("y", ("m1", "m3"), 1), InstancePlan("z", ("m3",), 1)]
    got = assign_plan(plan, pool)
    # e1 keeps m2 (exact); e0 has m1 (overlap 1 with y, no unload) → y; e3 (empty, no unload) → z;
    # e2 is left idle
    assert got == {"e0": ("m1", "m3"), "e1": ("m2",), "e2": (), "e3": ("m3",)}
    assert gpus_in_use(got, pool) == 3
    assert moves({e.engine_id: e.models for e in pool}, got) == 1 + 0 + 2 + 1
    with pytest.raises(PlacementInfeasible, match="needs 1 engines of tp=2 but the pool has 0"):
        assign_plan([InstancePlan("w", ("m1",), 2)], pool)
    with pytest.raises(ValueError, match="unique"):
        assign_plan([], [EngineSlot("a"), EngineSlot("a")])


def test_t_dec_comes_from_the_services_slo_when_not_given():
    """A model outside Aladdin's Table 2 (a tiny CPU model) is sized from its services' slo.tpot_s:
    the strictest one; an explicit t_dec wins; neither → infeasible naming the model."""
    pool = GpuPool("cpu", 4, 1)
    loose = ServiceLoad("a", "tiny-llama", 1.0, 20, 20, slo=Slo(tpot_s=0.5))
    strict = ServiceLoad("b", "tiny-llama", 1.0, 20, 20, slo=Slo(tpot_s=0.05))
    p = AladdinPlanner(AladdinOptions(k5=1.0))
    assert p.sizing.decode_slo("tiny-llama", hardware("cpu"), [loose, strict]) == 0.05
    assert len(p.place(pool, [loose, strict])) == 2  # ⌈1·2⌉ workers of tp 1
    assert (
        AladdinPlanner(AladdinOptions(k5=1.0, t_dec=0.3)).sizing.decode_slo(
            "tiny-llama", hardware("cpu"), [strict]
        )
        == 0.3
    )
    with pytest.raises(PlacementInfeasible, match=r"no service of it sets slo\.tpot_s"):
        AladdinPlanner(AladdinOptions(k5=1.0)).place(pool, [ServiceLoad("c", "tiny-llama", 1.0, 20, 20)])
