"""A policy bundle is the spec's sections, named; the flat keywords of earlier releases still read."""

from __future__ import annotations

import pytest
from llmfleet.policies.batching import StaticBatchPolicy
from llmfleet.policies.request.static_batches import StaticBatches
from llmfleet.sim.bundle import PolicyBundle
from llmfleet.sim.run import PRESETS, preset
from llmfleet.spec import PlacementSpec


def test_sections_from_names_mappings_or_sections() -> None:
    b = PolicyBundle("x", "seallm", {"policy": "jsq"}, PRESETS["seallm"].engine, capacity={"binding": "late"})
    assert b.placement == PlacementSpec(policy="seallm")
    assert (b.dispatch.policy, b.engine.policy, b.capacity.binding) == ("jsq", "doubling_budget", "late")
    assert PolicyBundle("y").capacity.binding == "early"  # presets bind on arrival, as the papers' systems


def test_overrides_replace_a_section_or_update_its_fields() -> None:
    b = preset("seallm-placement", dispatch="round_robin", placement={"interval_s": 30.0})
    assert b.placement.policy == "seallm" and b.placement.interval_s == 30.0 and b.placement.adaptive_interval
    assert b.dispatch.policy == "round_robin"
    assert preset("vllm", placement=None).placement == PRESETS["vllm"].placement


def test_a_bad_field_is_named_with_its_section() -> None:
    with pytest.raises(ValueError, match=r"placement\.interval_s: Input should be greater than 0"):
        PolicyBundle("x", {"interval_s": -1})
    with pytest.raises(ValueError, match="dispatch: unknown dispatch policy 'nope'"):
        PolicyBundle("x", dispatch="nope")
    with pytest.raises(ValueError, match="engine: bad options for request policy 'fcfs'"):
        PolicyBundle("x", engine={"policy": "fcfs", "options": {"batch_size": 3}})
    with pytest.raises(TypeError, match="unexpected keyword argument 'placment'"):
        PolicyBundle("x", placment="seallm")


def test_the_flat_keywords_are_refused_and_sections_say_it() -> None:
    old = ("local", "local_options", "placement_interval_s", "dispatch_options", "migration_epoch_s",
           "binding_options")  # fmt: skip
    for key in old:
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{key}'"):
            PolicyBundle("x", **{key: 1})
        with pytest.raises(TypeError, match=rf"unknown sections \['{key}'\]; valid: \['engine'"):
            PRESETS["vllm"].with_overrides(**{key: 1})
    recompute = {"policy": "static_sls", "options": {"batch_size": 4, "slice_end": "recompute"}}
    assert isinstance(PolicyBundle("x", engine=recompute).local_factory()(), StaticBatchPolicy)
    assert isinstance(
        PolicyBundle("z", engine="static_sls").local_factory()(), StaticBatches
    )  # keep: default


def test_the_report_entry_names_every_section() -> None:
    d = PRESETS["sls"].to_dict()
    assert d["engine"] == {"policy": "static_sls", "options": {"batch_size": 16, "slice_end": "recompute"}}
    assert set(d) == {
        "name",
        "description",
        "first_plan",
        "engine",
        "dispatch",
        "placement",
        "migration",
        "capacity",
    }
