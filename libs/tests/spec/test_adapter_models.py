"""Adapter entries of the cluster file's models: (base, adapter) instead of source, base a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmfleet.cli import up
from llmfleet.cli.apply import ApplyError, model_entry, parse_services_file, plan_apply
from llmfleet.config import ClusterConfig
from llmfleet.coord.desired import ModelEntry


def config(models: dict, engines: dict | None = None) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {"services": {"chat": {"model": "chat-lora"}}, "models": models, "engines": engines or {}}
    )


BASE = {"base-llama": {"source": "tiny://llama"}}


def test_an_adapter_entry_names_its_base_and_directory() -> None:
    cfg = config({**BASE, "chat-lora": {"base": "base-llama", "adapter": "/adapters/chat"}})
    m = cfg.models["chat-lora"]
    assert (m.is_adapter, m.base, m.adapter, m.source) == (True, "base-llama", "/adapters/chat", None)
    assert not cfg.models["base-llama"].is_adapter
    with pytest.raises(ValueError, match="'chat-lora' is an adapter of 'base-llama'"):
        cfg.model_spec("chat-lora")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"base": "ghost", "adapter": "/a"}, r"base 'ghost' must be a checkpoint entry.*\['base-llama'\]"),
        ({"base": "base-llama"}, "give source .* or base and adapter"),
        ({"adapter": "/a"}, "give source .* or base and adapter"),
        ({"source": "tiny://llama", "base": "base-llama", "adapter": "/a"}, "not both"),
    ],
)
def test_bad_adapter_entries_name_the_problem(entry: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config({**BASE, "chat-lora": entry})


def test_an_adapter_cannot_be_the_base_of_another() -> None:
    models = {
        **BASE,
        "a": {"base": "base-llama", "adapter": "/a"},
        "chat-lora": {"base": "a", "adapter": "/b"},
    }
    with pytest.raises(ValueError, match="base 'a' must be a checkpoint entry"):
        config(models)


def test_engines_host_base_models_not_adapters() -> None:
    models = {**BASE, "chat-lora": {"base": "base-llama", "adapter": "/a"}}
    with pytest.raises(ValueError, match=r"engine 'e0' lists adapter 'chat-lora'.*list 'base-llama'"):
        config(models, {"e0": {"models": ["chat-lora"]}})
    assert config(models, {"e0": {"models": ["base-llama"]}}).engines["e0"].models == ["base-llama"]


def test_apply_writes_an_adapter_entry_whose_base_is_a_checkpoint() -> None:
    cfg = config({**BASE, "chat-lora": {"base": "base-llama", "adapter": "/a"}})
    entry = model_entry("chat-lora", cfg.models["chat-lora"])
    assert (entry.source, entry.base, entry.adapter) == ("", "base-llama", "/a")
    text = "services: {chat: {model: chat-lora}}\nmodels: {chat-lora: {base: base-llama, adapter: /a}}\n"
    file, _ = parse_services_file(text)
    catalog = {"base-llama": ModelEntry("base-llama", "tiny://llama")}
    plan = plan_apply(file, {}, catalog)  # the base from etcd's catalog
    assert [(m.name, m.base, m.adapter) for m in plan.models] == [("chat-lora", "base-llama", "/a")]
    with pytest.raises(ApplyError, match=r"models\.chat-lora: base 'base-llama' must be a checkpoint entry"):
        plan_apply(file, {}, {})
    other = {**catalog, "x": ModelEntry("x", "", base="base-llama", adapter="/x")}
    bad, _ = parse_services_file("services: {}\nmodels: {y: {base: x, adapter: /y}}\n")
    with pytest.raises(ApplyError, match=r"models\.y: base 'x' must be a checkpoint entry"):
        plan_apply(bad, {}, other)


def test_lora_settings_are_read_by_native_and_vllm_engines() -> None:
    models = {**BASE, "chat-lora": {"base": "base-llama", "adapter": "/a"}}
    native = config(models, {"e0": {"models": ["base-llama"], "max_loras": 4, "max_lora_rank": 8}})
    assert native.engines["e0"].engine_args()[-4:] == ["--max-loras", "4", "--max-lora-rank", "8"]
    vllm = config(models, {"e0": {"backend": "vllm", "models": ["base-llama"], "max_loras": 4}})
    assert vllm.engines["e0"].engine_args() == ["--backend", "vllm", "--max-loras", "4"]
    # one setting, written once: vLLM's own LoRA arguments are the engine's max_loras / max_lora_rank
    with pytest.raises(ValueError, match=r"engine_args may not set .*max_loras \(the engine's max_loras\)"):
        config(models, {"e0": {"backend": "vllm", "vllm": {"engine_args": {"max_loras": 2}}}})
    emulated = ClusterConfig.model_validate(
        {"services": {}, "models": BASE, "emulated": {"engine": {"max_loras": 2}}}
    )
    assert emulated.emulated is not None and emulated.emulated.engine.engine_args()[-2:] == [
        "--max-loras",
        "2",
    ]


def test_llmfleet_up_hands_the_adapters_to_its_lora_engines(tmp_path: Path) -> None:
    models = {**BASE, "chat-lora": {"base": "base-llama", "adapter": "/adapters/chat"}}
    engines = {
        "lora": {"models": ["base-llama"], "max_loras": 4},
        "plain": {"models": ["base-llama"]},
        "vllm-lora": {"backend": "vllm", "models": ["base-llama"], "max_loras": 2},
    }
    plans = {
        p.name: p.argv
        for p in up.plan_services(
            config(models, engines), tmp_path / "c.yaml", etcd="x:1", state_dir=tmp_path
        )
    }
    lora = plans["lora"]
    assert lora[lora.index("--adapter") + 1] == "chat-lora=base-llama:/adapters/chat"
    assert "--adapter" not in plans["plain"]
    v = plans["vllm-lora"]  # a vLLM engine with max_loras registers the same adapters
    assert v[v.index("--adapter") + 1] == "chat-lora=base-llama:/adapters/chat"
    assert v[v.index("--max-loras") + 1] == "2"


LLAMA = {"llama2-7b": {"source": "emulated://llama2-7b"}}
ADAPTERS = {f"a{i}": {"base": "llama2-7b", "adapter": f"emulated://r{8 * (i + 1)}"} for i in range(2)}


def emulated_config(engine: dict) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {
            "services": {"s0": {"model": "a0"}, "s1": {"model": "a1"}, "base": {"model": "llama2-7b"}},
            "models": {**LLAMA, **ADAPTERS},
            "placement": {"policy": "aladdin"},
            "emulated": {"hardware": "A100-80GB", "count": 4, "engine": engine},
        }
    )


def test_a_planned_placement_places_the_bases_of_adapter_services() -> None:
    cfg = emulated_config({"max_loras": 2})
    # the planner sees checkpoints only: an adapter service's demand counts on its base's catalog model
    assert cfg.catalog_models() == {"llama2-7b": "llama2-7b"}
    assert cfg.adapter_bases() == {"a0": "llama2-7b", "a1": "llama2-7b"}
    assert (cfg.host_model("a1"), cfg.host_model("llama2-7b")) == ("llama2-7b", "llama2-7b")


def test_an_emulated_pool_accepts_adapter_services_and_hands_its_engines_the_adapters(tmp_path: Path) -> None:
    cfg = emulated_config({"max_loras": 2, "max_lora_rank": 16})
    (plan,) = [p for p in up.plan_services(cfg, tmp_path / "c.yaml", etcd="x:1", state_dir=tmp_path)
               if p.name.startswith("emu")]  # fmt: skip
    argv = plan.argv
    assert argv[argv.index("--max-loras") + 1] == "2"
    adapters = [argv[i + 1] for i, a in enumerate(argv) if a == "--adapter"]
    assert adapters == ["a0=llama2-7b:emulated://r8", "a1=llama2-7b:emulated://r16"]
    assert "llama2-7b=llama2-7b" in argv  # --sim-model of the base only
    with pytest.raises(
        ValueError, match=r"LoRA adapters \['a0', 'a1'\]: the emulated engines need adapter slots"
    ):
        emulated_config({})
