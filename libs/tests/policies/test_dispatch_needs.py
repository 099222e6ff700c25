"""Typed capabilities of dispatch policies: what each reads (``needs``), who hears finishes
(``FinishListener``), and the context policies are built with (``make_dispatch_policy(name, ctx)``)."""

from __future__ import annotations

import pytest
from llmfleet.costmodel.aladdin import AladdinModel, DecodeModel, PrefillModel
from llmfleet.policies.dispatch import (
    POLICIES,
    AladdinBestFit,
    DispatchContext,
    DispatchNeeds,
    DispatchRequest,
    EngineCandidate,
    FinishListener,
    RoundRobin,
    dispatch_needs,
    make_dispatch_policy,
)

NO_LOAD = DispatchContext(load_source=False)
LAT = {"m": AladdinModel(PrefillModel(1e-6, 0.0), DecodeModel(1e-6, 1e-4, 0.01))}


def test_every_policy_declares_what_it_reads():
    table = {name: dispatch_needs(name) for name in POLICIES}
    assert all(isinstance(n, DispatchNeeds) for n in table.values())
    assert {n for n, d in table.items() if d.load_blind} == {"round_robin", "scls_maxmin", "aladdin_bestfit"}
    assert {n for n, d in table.items() if d.reads_kv} == {
        "least_loaded",
        "best_fit_kv",
        "worst_fit_kv",
        "mell",
    }
    assert {n for n, d in table.items() if d.reads_queue} == {
        "jsq",
        "power_of_two",
        "least_loaded",
        "mell",
        "prefix_affinity",
        "lora_affinity",
        "lora_llmd",
    }
    assert {n for n, d in table.items() if d.reads_prompt} == {"prefix_affinity"}
    assert {n for n, d in table.items() if d.reads_predictions} == {
        "best_fit_kv",
        "scls_maxmin",
        "aladdin_bestfit",
    }
    assert {n for n, d in table.items() if d.reads_costs} == {"aladdin_bestfit"}


def test_finish_listeners_are_the_policies_that_keep_books():
    listeners = {n for n, cls in POLICIES.items() if issubclass(cls, FinishListener)}
    assert listeners == {"scls_maxmin", "aladdin_bestfit"}
    assert not isinstance(RoundRobin(), FinishListener)


@pytest.mark.parametrize("name", ["jsq", "power_of_two", "least_loaded", "best_fit_kv", "worst_fit_kv"])
def test_a_load_reading_policy_without_a_load_source_is_refused(name):
    with pytest.raises(ValueError, match=f"dispatch policy '{name}' reads engine load") as e:
        make_dispatch_policy(name, NO_LOAD)
    assert dispatch_needs(name).describe() in str(e.value)
    assert make_dispatch_policy(name, DispatchContext()).name == name  # with one it is built


def test_load_blind_policies_run_without_a_load_source():
    assert make_dispatch_policy("round_robin", NO_LOAD).name == "round_robin"
    assert make_dispatch_policy("scls_maxmin", NO_LOAD).name == "scls_maxmin"
    ctx = DispatchContext(latency_models=LAT, slos={"m": (1.0, 0.1)}, load_source=False)
    assert make_dispatch_policy("aladdin_bestfit", ctx).name == "aladdin_bestfit"


def test_cost_reading_policies_take_latency_models_and_slos_from_the_context():
    ctx = DispatchContext(latency_models=LAT, slos={"m": (1.0, 0.1)})
    p = make_dispatch_policy("aladdin_bestfit", ctx)
    assert isinstance(p, AladdinBestFit) and p.slos == {"m": (1.0, 0.1)}
    assert p.choose("m", [EngineCandidate("e", ("m",))], request=DispatchRequest("r", "m")) == "e"
    # options win over the context
    p = make_dispatch_policy("aladdin_bestfit", ctx, slos={"m": (2.0, 0.2)})
    assert p.slos == {"m": (2.0, 0.2)}
    with pytest.raises(ValueError, match="aladdin_bestfit needs latency_models"):
        make_dispatch_policy("aladdin_bestfit", DispatchContext())
    # a policy that reads no costs is not handed any (its constructor would refuse them)
    assert make_dispatch_policy("jsq", ctx).name == "jsq"


def test_describe_and_unknown_names():
    assert DispatchNeeds().describe() == "nothing but the engines' models"
    assert DispatchNeeds(reads_queue=True, reads_kv=True).describe() == "queue lengths, KV-cache use"
    with pytest.raises(ValueError, match="unknown dispatch policy 'nope'"):
        dispatch_needs("nope")
    with pytest.raises(ValueError, match="unknown dispatch policy 'nope'"):
        make_dispatch_policy("nope", DispatchContext())
