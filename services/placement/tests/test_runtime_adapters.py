"""LoRA adapter entries of the cluster file through etcd's model catalog (``models/``) and back."""

from __future__ import annotations

from llmfleet.config import ClusterConfig
from llmfleet.coord.desired import ModelEntry
from llmfleet_placement.controller import config_models, runtime_config


def config() -> ClusterConfig:
    return ClusterConfig.model_validate(
        {
            "services": {"chat": {"model": "chat-lora"}},
            "models": {
                "base-llama": {"source": "tiny://llama"},
                "chat-lora": {"base": "base-llama", "adapter": "/a"},
            },
        }
    )


def test_adapter_entries_reach_the_model_catalog_and_back() -> None:
    cfg = config()
    entries = {e.name: e for e in config_models(cfg)}
    assert (entries["chat-lora"].source, entries["chat-lora"].base, entries["chat-lora"].adapter) == (
        "",
        "base-llama",
        "/a",
    )
    assert ModelEntry.from_json(entries["chat-lora"].to_json()) == entries["chat-lora"]
    back, problems = runtime_config(cfg, cfg.services, entries)
    assert (
        not problems
        and back.models["chat-lora"].is_adapter
        and back.models["base-llama"].source == "tiny://llama"
    )


def test_a_planned_placement_plans_an_adapter_service_on_its_base() -> None:
    cfg = ClusterConfig.model_validate(
        {
            "services": {"chat": {"model": "chat-lora"}},
            "models": {
                "llama2-7b": {"source": "emulated://llama2-7b"},
                "chat-lora": {"base": "llama2-7b", "adapter": "/a"},
            },
            "placement": {"policy": "aladdin"},
        }
    )
    back, problems = runtime_config(cfg, cfg.services, {e.name: e for e in config_models(cfg)})
    assert not problems and list(back.services) == ["chat"]
    assert back.catalog_models() == {"llama2-7b": "llama2-7b"}
