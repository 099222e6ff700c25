"""The pure half of the live placement loop: pool, name mapping, plan -> engines, hysteresis."""

from __future__ import annotations

import pytest
from llmfleet.config import ClusterConfig
from llmfleet.policies.placement import (
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementInfeasible,
    PlannerReport,
    ServiceLoad,
    make_placement_policy,
)
from llmfleet.policies.placement.hysteresis import Hysteresis
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, ModelSpec, NodeRecord
from llmfleet_placement.planning import (
    LiveEngine,
    ModelNames,
    current_instances,
    describe_change,
    gpu_pool,
    infeasible_since,
    live_engines,
    plan_target,
    planner_loads,
    uncovered,
)

NAMES = ModelNames({"chat-model": "tiny-llama", "sum-model": "tiny-qwen2"})


def config(**placement) -> dict:
    return {
        "services": {"chat": {"model": "chat-model"}, "summarize": {"model": "sum-model"}},
        "models": {
            "chat-model": {"source": "tiny://llama", "sim_model": "tiny-llama"},
            "sum-model": {"source": "tiny://qwen2", "sim_model": "tiny-qwen2"},
        },
        "placement": placement,
    }


def test_names_map_both_ways_and_refuse_ambiguity() -> None:
    c = ClusterConfig.model_validate(config(policy="dedicated_even"))
    names = ModelNames(c.catalog_models())
    assert names.catalog("chat-model") == "tiny-llama" and names.served("tiny-qwen2") == "sum-model"
    with pytest.raises(ValueError, match="no served model maps"):
        names.served("llama2-7b")
    clash = config(policy="dedicated_even")
    clash["models"]["sum-model"]["sim_model"] = "tiny-llama"
    with pytest.raises(ValueError, match="both map to catalog model 'tiny-llama'"):
        ClusterConfig.model_validate(clash)
    unknown = config(policy="dedicated_even")
    del unknown["models"]["chat-model"]["sim_model"]
    with pytest.raises(ValueError, match=r"set models\.chat-model\.sim_model"):
        ClusterConfig.model_validate(unknown)
    ClusterConfig.model_validate(unknown | {"placement": {}})  # static needs no catalog names


def test_placement_config_errors_list_valid_names() -> None:
    with pytest.raises(ValueError, match=r"unknown placement policy 'nope'; valid: \['static'"):
        ClusterConfig.model_validate(config(policy="nope"))
    with pytest.raises(ValueError, match="unknown hardware 'tpu'"):
        ClusterConfig.model_validate(config(policy="dedicated_even", hardware="tpu"))
    with pytest.raises(ValueError, match="bad options for placement policy 'dedicated_even'"):
        ClusterConfig.model_validate(config(policy="dedicated_even", options={"bogus": 1}))
    p = ClusterConfig.model_validate(
        config(policy="colocate_all", interval_s=2, hardware="A100-80GB")
    ).placement
    assert (p.planned, p.interval_s, p.hardware, p.confirm_intervals) == (True, 2, "a100-80gb", 2)
    assert not ClusterConfig.model_validate(config()).placement.planned


def test_pool_from_node_records_and_desired_state() -> None:
    nodes = [
        NodeRecord("e1", ENGINE_ROLE, "a:1", models=("chat-model",), hardware="cpu", tp=1),
        NodeRecord("e0", ENGINE_ROLE, "a:0", models=(), hardware="cpu", tp=2),
        NodeRecord("sched", "scheduler", "a:9"),
    ]
    placements = {"e0": DesiredPlacement("e0", (ModelSpec("sum-model", "tiny://qwen2"),))}
    engines = live_engines(nodes, placements)
    assert [e.engine_id for e in engines] == ["e0", "e1"]
    assert engines[0].effective == ("sum-model",)  # its key: being loaded
    assert engines[1].effective == ("chat-model",)  # no key: keeps what it hosts
    pool, note = gpu_pool(engines, "a100-80gb", 8)
    assert pool == GpuPool("cpu", 3, 2) and note == ""  # groups no larger than the largest engine
    mixed = [LiveEngine("a", hardware="cpu"), LiveEngine("b", hardware="h100"), LiveEngine("c")]
    pool, note = gpu_pool(mixed, "a100-80gb", 4)
    assert pool == GpuPool("a100-80gb", 3, 1) and "planning them all as a100-80gb" in note
    assert current_instances(engines, NAMES) == (
        InstancePlan("e0", ("tiny-qwen2",), 2),
        InstancePlan("e1", ("tiny-llama",), 1),
    )


def test_loads_use_catalog_names_and_fill_unreported_services() -> None:
    specs = [ServiceSpec("chat", "chat-model"), ServiceSpec("summarize", "sum-model")]
    loads = planner_loads([ServiceLoad("chat", "chat-model", rate_rps=3.0)], specs, NAMES)
    assert [(s.name, s.model, s.rate_rps) for s in loads] == [
        ("chat", "tiny-llama", 3.0),
        ("summarize", "tiny-qwen2", 0.0),
    ]
    assert loads[0].slo == specs[0].slo


class FixedPlanner(PlannerReport):
    name = "fixed"
    needs = make_placement_policy("colocate_all").needs

    def __init__(self, plan: list[InstancePlan]) -> None:
        self.plan = plan

    def place(self, gpus, services, context=None):
        return self.plan


def test_plan_maps_onto_engines_with_fewest_moves() -> None:
    engines = [
        LiveEngine("e0", hosted=("chat-model",)),
        LiveEngine("e1", hosted=("sum-model",)),
        LiveEngine("e2"),
        LiveEngine("e3"),
    ]
    plan = [
        InstancePlan("x", ("tiny-qwen2",)),
        InstancePlan("y", ("tiny-llama",)),
        InstancePlan("z", ("tiny-llama",)),
    ]
    loads = [ServiceLoad("chat", "tiny-llama"), ServiceLoad("summarize", "tiny-qwen2")]
    r = plan_target(FixedPlanner(plan), GpuPool("cpu", 4), loads, engines, NAMES, PlacementContext())
    assert r.target == {"e0": ("chat-model",), "e1": ("sum-model",), "e2": ("chat-model",), "e3": ()}
    assert r.gpus_in_use == 3
    assert describe_change({e.engine_id: e.effective for e in engines}, r.target) == "e2: +chat-model"
    with pytest.raises(PlacementInfeasible, match="needs 6 engines"):
        plan_target(FixedPlanner(plan * 2), GpuPool("cpu", 4), loads, engines, NAMES, PlacementContext())


def test_a_real_planner_over_live_engines() -> None:
    engines = [LiveEngine(f"e{i}", hardware="cpu") for i in range(4)]
    loads = [ServiceLoad("chat", "tiny-llama", rate_rps=2.0), ServiceLoad("summarize", "tiny-qwen2")]
    planner = make_placement_policy("dedicated_even")
    pool, _ = gpu_pool(engines, "cpu", 8)
    r = plan_target(planner, pool, loads, engines, NAMES, PlacementContext())
    assert sorted(r.target.values()) == [("chat-model",)] * 2 + [("sum-model",)] * 2
    assert uncovered({}, ["chat-model"]) == ["chat-model"] and uncovered(r.target, ["chat-model"]) == []


def test_hysteresis_needs_the_same_proposal_twice_unless_urgent() -> None:
    h = Hysteresis(confirm=2)
    a, b = {"e0": ("m",)}, {"e0": ("n",)}
    assert not h.decide(a, urgent=False)
    assert not h.decide(b, urgent=False)  # a different proposal starts over
    assert h.decide(b, urgent=False)  # the same one again: apply
    assert h.candidate is None
    assert h.decide(a, urgent=True)  # unserved model: at once
    assert Hysteresis(confirm=1).decide(a, urgent=False)


def test_infeasible_since_turns_cumulative_service_counts_into_per_model_deltas():
    specs = [
        ServiceSpec("chat", "chat-model"),
        ServiceSpec("chat2", "chat-model"),
        ServiceSpec("sum", "sum-model"),
    ]
    seen: dict[str, int] = {}
    # first sight (a new leader): baselines only, no spurious scale-out
    assert infeasible_since({"chat": 40, "sum": 3}, seen, specs, NAMES) == {}
    assert infeasible_since({"chat": 45, "chat2": 1, "sum": 3}, seen, specs, NAMES) == {"tiny-llama": 5}
    assert infeasible_since({"chat": 45, "chat2": 4, "sum": 9}, seen, specs, NAMES) == {
        "tiny-llama": 3,
        "tiny-qwen2": 6,
    }
    # a scheduler restarted (its count fell): new baseline, nothing added
    assert infeasible_since({"chat": 2, "chat2": 4, "sum": 9}, seen, specs, NAMES) == {}
    assert infeasible_since({"chat": 3, "unknown": 7}, seen, specs, NAMES) == {"tiny-llama": 1}


def test_an_adapter_services_demand_counts_on_its_base_and_the_plan_places_the_base() -> None:
    names = ModelNames({"base-llama": "tiny-llama"}, {"lora-a": "base-llama", "lora-b": "base-llama"})
    assert (names.catalog("lora-a"), names.host("lora-b"), names.host("base-llama")) == (
        "tiny-llama",
        "base-llama",
        "base-llama",
    )
    specs = [ServiceSpec("a", "lora-a"), ServiceSpec("b", "lora-b")]
    loads = planner_loads([ServiceLoad("a", "lora-a", rate_rps=3.0)], specs, names)
    assert [(s.name, s.model, s.rate_rps, s.adapter) for s in loads] == [
        ("a", "tiny-llama", 3.0, "lora-a"),  # the planner prices its adapter on the base
        ("b", "tiny-llama", 0.0, "lora-b"),
    ]
    engines = [LiveEngine(f"e{i}", hardware="cpu") for i in range(2)]
    plan = [InstancePlan("x", ("tiny-llama",)), InstancePlan("y", ("tiny-llama",))]
    r = plan_target(FixedPlanner(plan), GpuPool("cpu", 2), loads, engines, names, PlacementContext())
    assert r.target == {"e0": ("base-llama",), "e1": ("base-llama",)}  # adapters follow their traffic


def test_the_pool_carries_the_engines_adapter_slots_from_the_cluster_file() -> None:
    """The leader's pool holds the engines' LoRA pool (``ClusterConfig.planned_engines``), so its planner
    reserves the adapter pool beside each base; the largest any engine sets, LoRA off without one."""
    cfg = ClusterConfig.model_validate(
        {
            "services": {"chat": {"model": "chat-lora"}},
            "models": {
                "tiny-llama": {"source": "tiny://llama"},
                "chat-lora": {"base": "tiny-llama", "adapter": "/a"},
            },
            "engines": {
                "e0": {"models": ["tiny-llama"], "max_loras": 2, "max_lora_rank": 8},
                "e1": {"models": ["tiny-llama"], "max_loras": 4},
                "e2": {"models": ["tiny-llama"]},
            },
        }
    )
    assert cfg.planned_engines() == {"adapter_slots": 4, "max_lora_rank": 16}
    engines = [LiveEngine(f"e{i}", hardware="cpu") for i in range(3)]
    pool, _ = gpu_pool(engines, "cpu", 8, cfg.planned_engines())
    assert (pool.adapter_slots, pool.max_lora_rank) == (4, 16)
    assert gpu_pool(engines, "cpu", 8)[0].adapter_slots == 0
    cfg.engines = {"e0": cfg.engines["e2"]}
    assert cfg.planned_engines() == {"adapter_slots": 0, "max_lora_rank": 16}
