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
