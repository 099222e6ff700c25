from pathlib import Path

import pytest
from llmfleet.config import ClusterConfig, EtcdSettings
from llmfleet.types import DesiredPlacement, ModelSpec, NodeRecord, ServiceSpec, Slo

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_local_config_is_valid():
    cfg = ClusterConfig.load(ROOT / "deploy/local/cluster.yaml")
    assert {s.name for s in cfg.service_specs()} == set(cfg.services)
    assert all(p.models for p in cfg.placements())


def test_unknown_model_reference_is_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("services: {chat: {model: ghost}}\nmodels: {m: {source: tiny://llama}}\n")
    with pytest.raises(ValueError, match="ghost"):
        ClusterConfig.load(p)


def test_missing_config_file(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        ClusterConfig.load(tmp_path / "nope.yaml")


def test_etcd_settings_env(monkeypatch):
    monkeypatch.setenv("LLMFLEET_ETCD", "10.0.0.1:2379, 10.0.0.2:2379")
    monkeypatch.setenv("LLMFLEET_PREFIX", "fleet/")
    s = EtcdSettings.from_env()
    assert s.endpoints == ["10.0.0.1:2379", "10.0.0.2:2379"] and s.prefix == "/fleet"
    assert EtcdSettings.from_env(endpoints="h:1", ttl=4).lease_ttl_s == 4


def test_json_round_trips():
    spec = ServiceSpec("chat", "m", Slo(1.0, 0.1), priority=2, default_max_tokens=7)
    assert ServiceSpec.from_json(spec.to_json()) == spec
    node = NodeRecord("e0", "engine", "127.0.0.1:1", models=("a", "b"), pid=3)
    assert NodeRecord.from_json(node.to_json()) == node
    dp = DesiredPlacement("e0", (ModelSpec("a", "tiny://llama"),))
    assert DesiredPlacement.from_json(dp.to_json()) == dp
