import json
import re
from pathlib import Path

import pytest
import yaml
from llmfleet.config import ClusterConfig, EtcdSettings
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import DEFAULT_SLO, DesiredPlacement, ModelSpec, NodeRecord, Slo

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_local_config_is_valid():
    cfg = ClusterConfig.load(ROOT / "deploy/local/cluster.yaml")
    assert {s.name for s in cfg.service_specs()} == set(cfg.services)
    # the demo: a planner places the models, with one engine more than the services need at rest
    assert cfg.placement.policy == "aladdin"
    assert len(cfg.engines) == len({s.model for s in cfg.service_specs()}) + 1


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
    spec = ServiceSpec("chat", "m", Slo(1.0, 0.1), priority=2, max_tokens=7)
    assert ServiceSpec.from_json(spec.to_json()) == spec
    node = NodeRecord("e0", "engine", "127.0.0.1:1", models=("a", "b"), pid=3)
    assert NodeRecord.from_json(node.to_json()) == node
    dp = DesiredPlacement("e0", (ModelSpec("a", "tiny://llama"),))
    assert DesiredPlacement.from_json(dp.to_json()) == dp


# -- one SLO type ----------------------------------------------------------------------------------------
def test_slo_objectives_are_optional_and_validated():
    assert Slo() == Slo(None, None, 5.0, None)  # no TTFT/TPOT objective, no deadline, SeaLLM's 5×
    assert Slo(1, 0.1, deadline_s=30).deadline_s == 30.0 and isinstance(Slo(1, 1).ttft_s, float)
    for bad in ({"ttft_s": 0}, {"tpot_s": -1}, {"deadline_s": float("inf")}, {"latency_scale": None},
                {"latency_scale": True}, {"ttft_s": "2"}):  # fmt: skip
        with pytest.raises(ValueError, match=next(iter(bad))):
            Slo(**bad)


def test_slo_from_dict_names_unknown_keys_and_the_spelling_of_aladdins_name():
    assert Slo.from_dict({"tpot_s": 0.1, "ttft_s": 1}) == Slo(ttft_s=1, tpot_s=0.1)
    with pytest.raises(ValueError, match=r"svc: unknown keys \['ttft'\]; valid: \['ttft_s', 'tpot_s'"):
        Slo.from_dict({"ttft": 1}, where="svc")
    with pytest.raises(ValueError, match="svc: atgt_s was renamed: write tpot_s"):
        Slo.from_dict({"atgt_s": 0.1, "ttft_s": 1}, where="svc")
    with pytest.raises(ValueError, match="svc: deadline_s must be a positive number"):
        Slo.from_dict({"deadline_s": 0}, where="svc")


def test_service_spec_keeps_the_deadline_in_its_slo():
    spec = ServiceSpec("s", "m", Slo(1.0, 0.1, latency_scale=3.0, deadline_s=30.0), dispatch="jsq")
    assert ServiceSpec.from_json(spec.to_json()) == spec
    assert spec.deadline_s == 30.0 and ServiceSpec("s", "m").deadline_s == 0.0  # the wire form: 0 = none
    assert "deadline_s" not in json.loads(spec.to_json())  # one place: slo.deadline_s
    assert ServiceSpec("s", "m").slo == DEFAULT_SLO == Slo(5.0, 0.5)
    with pytest.raises(ValueError, match=r"needs slo\.ttft_s and slo\.tpot_s"):
        ServiceSpec("s", "m", Slo(deadline_s=3.0))


def test_a_service_record_is_read_with_the_cluster_files_rules():
    record = {"name": "s", "model": "m", "slo": {"tpot_s": 0.2}, "priority": 1, "predict": True}
    spec = ServiceSpec.from_json(json.dumps(record))
    assert spec.slo == Slo(DEFAULT_SLO.ttft_s, 0.2) and spec.priority == 1 and spec.predict
    assert ServiceSpec.from_json(json.dumps({"name": "s", "model": "m", "slo": {}})).slo == DEFAULT_SLO
    for old, new in [({"default_max_tokens": 8}, "write max_tokens"),
                     ({"deadline_s": 30.0}, "write slo: {deadline_s: ...}"),
                     ({"dispatch_options": {"seed": 7}}, "write dispatch: {policy: NAME, options: {...}}")]:  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(f"{next(iter(old))} was renamed: {new}")):
            ServiceSpec.from_json(json.dumps({**record, **old}))
    with pytest.raises(ValueError, match="tenant"):  # a key no field has
        ServiceSpec.from_json(json.dumps({**record, "tenant": "x"}))
    with pytest.raises(ValueError, match="default_max_tokens was renamed: write max_tokens"):  # in Python too
        ServiceSpec("s", "m", **{"default_max_tokens": 8})


# -- the cluster config: SLOs, engine limits and policy options ----------------------------------------------
def write(tmp_path: Path, doc: dict) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def config(**engine) -> dict:
    return {
        "services": {"chat": {"model": "m", "slo": {"ttft_s": 1, "tpot_s": 0.1, "deadline_s": 30}}},
        "models": {"m": {"source": "tiny://llama"}},
        "engines": {"e0": {"models": ["m"], **engine}},
    }


def test_engine_limits_and_policy_options_become_engine_flags(tmp_path):
    cfg = ClusterConfig.load(write(tmp_path, config(
        policy="static_sls", options={"batch_size": 8, "max_iterations": 64, "slice_end": "recompute"},
        max_running=16, max_batch_requests=8, max_prefill_tokens=2048, watermark=0.05, block_bytes=4096,
        block_tokens=32,
    )))  # fmt: skip
    e = cfg.engines["e0"]
    assert e.limits() == {"max_running": 16, "max_batch_requests": 8, "max_prefill_tokens": 2048,
                          "watermark": 0.05, "block_tokens": 32, "block_bytes": 4096}  # fmt: skip
    assert e.engine_args() == [
        "--policy", "static_sls",
        "--policy-options", '{"batch_size": 8, "max_iterations": 64, "slice_end": "recompute"}',
        "--max-running", "16", "--max-batch-requests", "8", "--max-prefill-tokens", "2048",
        "--watermark", "0.05", "--block-tokens", "32", "--block-bytes", "4096", "--stream-interval-s", "0.0",
    ]  # fmt: skip
    assert ClusterConfig.model_validate(config()).engines["e0"].engine_args() == [
        "--policy", "fcfs", "--stream-interval-s", "0.0"
    ]  # fmt: skip
    # block_tokens sizes the simulator's blocks: a live native engine cannot run it, so up refuses it
    with pytest.raises(ValueError, match=r"engines\.e0\.block_tokens: .*block_bytes"):
        cfg.check_live()
    (spec,) = cfg.service_specs()
    assert spec.slo == Slo(1.0, 0.1, deadline_s=30.0)


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"max_running": 0}, "engines.e0.max_running: Input should be greater than or equal to 1, got 0"),
        ({"block_bytes": 100}, "engines.e0.block_bytes: Input should be a multiple of 16, got 100"),
        ({"watermark": 1.0}, "engines.e0.watermark: Input should be less than 1, got 1.0"),
        ({"max_runing": 8}, "engines.e0.max_runing: Extra inputs are not permitted"),
        ({"policy": "static_sls", "options": {"batch": 8}},
         "engines.e0.options: bad options for batching policy 'static_sls': "
         "StaticSlsOptions.__init__() got an unexpected keyword argument 'batch'"),
        ({"policy": "static_sls", "options": {"batch_size": 0}}, "batch_size must be an int >= 1, got 0"),
        ({"policy": "scls", "options": {"keep_kv": False}},
         "engines.e0.options: bad options for engine policy 'scls': keep_kv was renamed: write slice_end: "
         "keep|recompute"),
        ({"options": {"slice_end": "keep"}}, "bad options for request policy 'fcfs'"),
        ({"policy_options": {"batch_size": 8}}, "engines.e0: policy_options was renamed: write options"),
        ({"policy": "nope", "options": {"x": 1}}, "engines.e0.policy: unknown engine policy 'nope'"),
    ],
)  # fmt: skip
def test_bad_engine_settings_name_the_key(tmp_path, engine, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ClusterConfig.load(write(tmp_path, config(**engine)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"deadline_s": 30}, "services.chat: deadline_s was renamed: write slo: {deadline_s: ...}"),
        ({"slo": {"atgt_s": 0.1}}, "services.chat.slo: atgt_s was renamed: write tpot_s (Aladdin's average "
                                   "token generation time)"),
        ({"slo": {"ttft_s": -1}}, "services.chat.slo: ttft_s must be a positive number, got -1"),
        ({"slo": {"latency_scale": 0}}, "services.chat.slo: latency_scale must be a positive number, got 0"),
        ({"slo": {"deadline": 3}}, "services.chat.slo: unknown keys ['deadline']; valid: ['ttft_s', "),
        ({"default_max_tokens": 8}, "services.chat: default_max_tokens was renamed: write max_tokens"),
        ({"max_tokens": 0}, "services.chat.max_tokens: Input should be greater than 0, got 0"),
        ({"name": "other"}, "services: chat: a service's name is its key under services:, not a field"),
    ],
)  # fmt: skip
def test_bad_slo_names_the_key(tmp_path, change, message):
    doc = config()
    doc["services"]["chat"] = {"model": "m", **change}
    with pytest.raises(ValueError, match=re.escape(message)):
        ClusterConfig.load(write(tmp_path, doc))


def test_every_slo_key_reaches_the_service_spec(tmp_path):
    doc = config()
    doc["services"]["chat"]["slo"] = {"tpot_s": 0.2, "latency_scale": 3, "deadline_s": 9}
    (spec,) = ClusterConfig.load(write(tmp_path, doc)).service_specs()
    assert spec.slo == Slo(ttft_s=5.0, tpot_s=0.2, latency_scale=3.0, deadline_s=9.0)  # unset ttft: default


def test_sim_model_must_be_a_catalog_name(tmp_path):
    doc = config()
    doc["models"]["m"]["sim_model"] = "Llama-2-7B"
    assert ClusterConfig.load(write(tmp_path, doc)).models["m"].sim_model == "llama2-7b"
    doc["models"]["m"]["sim_model"] = "gpt-5"
    with pytest.raises(ValueError, match=r"models.m.sim_model: unknown model 'gpt-5'; valid: \["):
        ClusterConfig.load(write(tmp_path, doc))


def test_placement_window_must_be_a_reported_window(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(
        "services: {chat: {model: m}}\nmodels: {m: {source: tiny://llama}}\n"
        "placement: {policy: aladdin, window_s: 20}\n"
    )
    with pytest.raises(ValueError, match=r"window_s must be one of .*10, 60, 300 s; got 20"):
        ClusterConfig.load(p)


def test_migration_section(tmp_path):
    p = tmp_path / "c.yaml"
    base = "services: {chat: {model: m}}\nmodels: {m: {source: tiny://llama}}\n"
    p.write_text(base + "migration: {policy: mell, options: {batching: false}, epoch_s: 0.5}\n")
    cfg = ClusterConfig.load(p)
    assert cfg.migration.args()[:6] == [
        "--policy",
        "mell",
        "--policy-options",
        '{"batching": false}',
        "--epoch-s",
        "0.5",
    ]
    p.write_text(base + "migration: {policy: mell, options: {packing: 2}}\n")
    with pytest.raises(ValueError, match=r"bad options for migration policy 'mell'.*packing"):
        ClusterConfig.load(p)
    p.write_text(base + "migration: {policy: pack}\n")
    with pytest.raises(
        ValueError, match=r"unknown migration policy 'pack'; valid: \['llumnix_lb', 'mell', 'none'\]"
    ):
        ClusterConfig.load(p)


@pytest.mark.parametrize(
    ("dispatch", "options"),
    [
        ({"policy": "power_of_two", "options": {"seed": 7}}, {"seed": 7}),
        ("power_of_two", {}),  # a section written as its policy name alone, as every section may be
    ],
)
def test_a_service_names_its_dispatch_policy_with_options(tmp_path, dispatch, options):
    doc = config()
    doc["services"]["chat"] = {"model": "m", "dispatch": dispatch}
    (spec,) = ClusterConfig.load(write(tmp_path, doc)).service_specs()
    assert spec.dispatch is not None and (spec.dispatch.policy, spec.dispatch.options) == (
        "power_of_two",
        options,
    )
    assert ClusterConfig.model_validate(config()).service_specs()[0].dispatch is None  # the scheduler's


@pytest.mark.parametrize(
    ("dispatch", "message"),
    [
        ({"dispatch": {"options": {"seed": 7}}}, "services.chat.dispatch: a service's dispatch section names its "
                                                 "policy (policy: ...); the scheduler's default policy takes "
                                                 "scheduler.dispatch.options"),
        ({"dispatch": {"policy": "power_of_two", "options": {"bogus": 1}}},
         "services.chat.dispatch: bad options for dispatch policy 'power_of_two'"),
        ({"dispatch": {"policy": "jsq", "opts": {}}}, "services.chat.dispatch.opts: Extra inputs are not permitted"),
        ({"dispatch": "power_of_two", "dispatch_options": {"seed": 7}},
         "services.chat: dispatch_options was renamed: write dispatch: {policy: NAME, options: {...}}"),
    ],
)  # fmt: skip
def test_bad_service_dispatch_options_name_the_key(tmp_path, dispatch, message):
    doc = config()
    doc["services"]["chat"] = {"model": "m", **dispatch}
    with pytest.raises(ValueError, match=re.escape(message)):
        ClusterConfig.load(write(tmp_path, doc))


def test_a_cost_reading_dispatch_policy_gets_its_models_where_it_runs():
    """Aladdin's latency models and SLOs come from the scheduler: its other options are checked by name."""
    spec = ServiceSpec("s", "m", dispatch={"policy": "aladdin_bestfit", "options": {"gamma": 0.3}})
    assert spec.dispatch is not None and spec.dispatch.options == {"gamma": 0.3}
    with pytest.raises(ValueError, match=r"bad options for dispatch policy 'aladdin_bestfit'.*'gama'"):
        ServiceSpec("s", "m", dispatch={"policy": "aladdin_bestfit", "options": {"gama": 0.3}})


def test_the_simulator_refuses_a_service_whose_dispatch_options_differ(tmp_path):
    doc = config()
    doc["services"]["chat"] = {"model": "m", "dispatch": "round_robin"}
    ClusterConfig.load(write(tmp_path, doc)).policies()  # the schedulers' policy, no options: the same
    doc["services"]["chat"] = {"model": "m", "dispatch": {"policy": "power_of_two", "options": {"seed": 7}}}
    doc["scheduler"] = {"dispatch": "power_of_two"}
    with pytest.raises(ValueError, match=r"service 'chat' dispatches by 'power_of_two' \{'seed': 7\}"):
        ClusterConfig.load(write(tmp_path, doc)).policies()


def test_a_setting_only_the_simulator_runs_is_refused_live():
    data = yaml.safe_load((ROOT / "deploy/local/cluster.yaml").read_text())
    data["placement"] = {**data.get("placement", {}), "interval_s": 10, "adaptive_interval": True}
    config = ClusterConfig.model_validate(data)  # the simulator reads it
    with pytest.raises(ValueError, match=r"placement\.adaptive_interval: the live placement leader"):
        config.check_live()
    ClusterConfig.load(ROOT / "deploy/local/cluster.yaml").check_live()


def test_a_cluster_config_round_trips_through_its_dump():
    """What llmfleet up writes for its children (e.g. with --emulate) reads back as the same config."""
    cfg = ClusterConfig.load(ROOT / "deploy/local/cluster.yaml")
    data = cfg.model_dump()
    assert all("name" not in entry for entry in data["services"].values())  # the key is the name
    assert ClusterConfig.model_validate(data) == cfg
