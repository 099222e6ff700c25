"""Simulated services share the live SLO type; a live cluster config maps onto a simulation spec."""

from __future__ import annotations

import argparse
import re

import pytest
from llmfleet.cli.sim import add_arguments
from llmfleet.cli.sim_args import sim_spec
from llmfleet.config import ClusterConfig
from llmfleet.sim.spec import EngineSettings, SimService, from_cluster_config, services_from_dicts
from llmfleet.types import Slo


def test_service_slo_from_its_slo_mapping():
    a, b, c = services_from_dicts([
        {"name": "a", "model": "llama2-7b", "slo": {"ttft_s": 0.4, "tpot_s": 0.015}, "max_tokens": 9},
        {"name": "b", "model": "llama2-7b", "slo": {"ttft_s": 0.4, "tpot_s": 0.015, "deadline_s": 20}},
        {"name": "c", "model": "llama2-7b"},
    ])  # fmt: skip
    assert a.slo == Slo(0.4, 0.015) and a.max_tokens == 9
    assert b.slo == Slo(0.4, 0.015, deadline_s=20.0) and b.deadline_s == 20.0
    assert c.slo == Slo() and c.deadline_s is None


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"name": "a", "model": "m", "slo": {"ttft_s": 1}, "deadline_s": 3},
         "service #0: deadline_s was renamed: write slo: {deadline_s: ...}"),
        ({"name": "a", "model": "m", "ttft_s": 0.4}, "service #0: ttft_s was renamed: write slo: {ttft_s: ...}"),
        ({"name": "a", "model": "m", "atgt_s": 0.1}, "service #0: atgt_s was renamed: write slo: {tpot_s: ...}"),
        ({"name": "a", "model": "m", "slo": {"atgt_s": 0.1}}, "service #0: slo: atgt_s was renamed: write tpot_s"),
        ({"name": "a", "model": "m", "slo": {"ttft": 1}}, "service #0: slo: unknown keys ['ttft']"),
        ({"name": "a", "model": "m", "ttft": 1}, "service #0: unknown keys ['ttft']"),
        ({"name": "a", "model": "m", "slo": {"latency_scale": -1}}, "latency_scale must be a positive number"),
        ({"name": "a", "model": "m", "max_tokens": 0}, "max_tokens and weight must be positive"),
    ],
)  # fmt: skip
def test_bad_services_are_named(item, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        services_from_dicts([item])


def cluster(**engines) -> ClusterConfig:
    return ClusterConfig.model_validate({
        "services": {
            "chat": {"model": "demo", "slo": {"ttft_s": 2, "tpot_s": 0.2, "deadline_s": 30}},
            "code": {"model": "tiny-qwen2"},
        },
        "models": {"demo": {"source": "tiny://llama", "sim_model": "llama2-7b"},
                   "tiny-qwen2": {"source": "tiny://qwen2"}},
        "engines": engines or {"e0": {"models": ["demo"]}},
    })  # fmt: skip


def test_cluster_config_services_keep_their_slo_and_catalog_models():
    services, engine = from_cluster_config(cluster())
    assert services == (
        SimService("chat", "llama2-7b", Slo(2.0, 0.2, deadline_s=30.0)),
        SimService("code", "tiny-qwen2", Slo(5.0, 0.5)),  # a catalog name; the live default SLO
    )
    assert engine == EngineSettings()  # no limits set: the simulator's GPU defaults


def test_cluster_config_engine_limits_apply_to_every_instance():
    limits = {"max_running": 64, "max_prefill_tokens": 2048, "watermark": 0.02, "block_tokens": 32}
    _, engine = from_cluster_config(cluster(
        e0={"models": ["demo"], **limits, "block_bytes": 4096}, e1={"models": ["demo"], "max_running": 64},
        e2={"models": ["demo"]},  # sets nothing: no conflict
    ))  # fmt: skip
    assert engine == EngineSettings(**limits)  # block_bytes sizes the live engine's own models: not mapped
    with pytest.raises(ValueError, match=r"engines set different max_running \(e0: 64, e2: 32\)"):
        from_cluster_config(cluster(e0={"models": ["demo"], "max_running": 64}, e1={"models": ["demo"]},
                                    e2={"models": ["demo"], "max_running": 32}))  # fmt: skip


def test_a_model_outside_the_catalog_needs_a_sim_model():
    cfg = cluster()
    cfg.models["demo"].sim_model = None
    with pytest.raises(
        ValueError, match=r"model 'demo' \(source tiny://llama\) is not in the cost-model catalog"
    ):
        from_cluster_config(cfg)


def sim_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmfleet sim")
    add_arguments(p)
    return p


def emulated_cluster(**pool) -> ClusterConfig:
    return ClusterConfig.model_validate({
        "services": {"chat": {"model": "llama2-7b"}},
        "models": {"llama2-7b": {"source": "emulated://llama2-7b"}},
        "emulated": {"hardware": "A100-80GB", "count": 4, **pool},
    })  # fmt: skip


def test_an_emulated_pool_sizes_the_simulated_instances_and_names_their_costs():
    _, engine = from_cluster_config(emulated_cluster(mem_fraction=0.6, engine={"max_running": 64}))
    assert engine == EngineSettings(max_running=64, mem_fraction=0.6)
    config = emulated_cluster(cost_source="roofline")
    flags = sim_parser().parse_args(["--cluster", "4xA100-80GB"])
    assert sim_spec(flags, config).cost_source == "roofline"  # the emulated engines' own costs
    flags = sim_parser().parse_args(["--cluster", "4xA100-80GB", "--cost-source", "vidur"])
    assert sim_spec(flags, config).cost_source == "vidur"  # the flag, when given
    assert sim_spec(sim_parser().parse_args(["--cluster", "4xA100-80GB"]), None).cost_source == "calibrated"
