"""A cluster file's vLLM engines: ``backend: vllm`` with ``vllm:`` settings, checked at load, passed to
the engine as ``--vllm-options`` (which the engine's parser checks with the same model), and refused at
start where vLLM is not installed, with the command that installs it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from llmfleet.cli import up
from llmfleet.cli.up_plan import require_backends
from llmfleet.config import ClusterConfig
from llmfleet.spec.sizes import size_bytes
from llmfleet.spec.vllm import VllmSettings
from llmfleet_engine.main import build_parser

VLLM_ENGINE = {
    "backend": "vllm",
    "models": ["m"],
    "vllm": {"kv_cache_memory_bytes": "1GiB", "max_model_len": 512, "enforce_eager": True},
}
BASE = {
    "services": {"chat": {"model": "m"}},
    "models": {"m": {"source": "tiny://mistral"}},
    "engines": {"v0": VLLM_ENGINE, "n0": {"models": ["m"]}},
}


def plans(tmp_path: Path, config: dict) -> dict[str, list[str]]:
    cfg = ClusterConfig.model_validate(config)
    return {
        p.name: p.argv for p in up.plan_services(cfg, tmp_path / "c.yaml", etcd="x:1", state_dir=tmp_path)
    }


def test_a_vllm_engine_gets_its_settings_as_one_flag_and_no_native_ones(tmp_path: Path) -> None:
    argv = plans(tmp_path, BASE)["v0"]
    assert argv[argv.index("--backend") + 1] == "vllm"
    options = json.loads(argv[argv.index("--vllm-options") + 1])
    assert options == {"kv_cache_memory_bytes": 2**30, "max_model_len": 512, "enforce_eager": True}
    assert "--policy" not in argv and "--threads" not in argv
    native = plans(tmp_path, BASE)["n0"]
    assert "--backend" not in native and "--threads" in native and "--policy" in native


def test_the_engine_parses_what_up_passes(tmp_path: Path) -> None:
    argv = plans(tmp_path, BASE)["v0"][1:]
    args = build_parser().parse_args(argv)
    assert args.backend == "vllm"
    assert args.vllm_options == VllmSettings(
        kv_cache_memory_bytes=2**30, max_model_len=512, enforce_eager=True
    )


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({**VLLM_ENGINE, "policy": "scls"}, r"\['policy'\] apply to the native backend only"),
        ({**VLLM_ENGINE, "max_running": 8}, r"\['max_running'\] apply to the native backend only"),
        ({"models": ["m"], "vllm": {}}, "vllm: settings need backend: vllm"),
        ({"backend": "emulated"}, "emulated: section"),
        ({**VLLM_ENGINE, "vllm": {"max_model_lenn": 5}}, "max_model_lenn"),
        ({**VLLM_ENGINE, "vllm": {"kv_cache_memory_bytes": "lots"}}, "not a size: 'lots'"),
        ({**VLLM_ENGINE, "vllm": {"engine_args": {"max_model_len": 5}}}, "engine_args may not set"),
        ({**VLLM_ENGINE, "vllm": {"dtype": "int8"}}, "dtype"),
    ],
)
def test_bad_vllm_engines_are_refused_naming_the_problem(engine: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterConfig.model_validate({**BASE, "engines": {"v0": engine}})


def test_an_emulated_pools_engine_cannot_be_a_vllm_engine() -> None:
    with pytest.raises(ValueError, match="no backend, models, device or port"):
        ClusterConfig.model_validate(
            {
                **BASE,
                "engines": {},
                "emulated": {"engine": {"backend": "vllm"}},
                "placement": {"policy": "aladdin"},
            }
        )


def test_sizes() -> None:
    assert size_bytes("512MiB") == 512 * 2**20 and size_bytes("1.5GB") == 1_500_000_000
    assert size_bytes(4096) == 4096


def test_up_refuses_vllm_engines_without_vllm_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = ClusterConfig.model_validate(BASE)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(ValueError, match=r"engines \['v0'\] have backend: vllm.*make setup-vllm"):
        require_backends(cfg)
    require_backends(ClusterConfig.model_validate({**BASE, "engines": {"n0": {"models": ["m"]}}}))


@pytest.mark.parametrize("flag", ["--policy", "--threads", "--max-running"])
def test_the_engine_refuses_native_flags_with_the_vllm_backend(flag: str, capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--backend", "vllm", flag, "fcfs" if flag == "--policy" else "2"])
    assert f"{flag} does not apply to --backend vllm" in capsys.readouterr().err


def test_vllm_options_need_the_vllm_backend(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--vllm-options", "{}"])
    assert "--vllm-options applies to --backend vllm only" in capsys.readouterr().err


def test_the_shipped_vllm_config_plans_one_vllm_engine(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[3]
    cfg = ClusterConfig.load(root / "deploy/local/vllm.yaml")
    argv = {
        p.name: p.argv for p in up.plan_services(cfg, tmp_path / "c.yaml", etcd="x:1", state_dir=tmp_path)
    }
    options = json.loads(argv["vllm-0"][argv["vllm-0"].index("--vllm-options") + 1])
    assert options["kv_cache_memory_bytes"] == 2**30 and options["enforce_eager"] is True
