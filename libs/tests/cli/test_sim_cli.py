"""``llmfleet sim``: the table, the report files, worker selection and bad input (in process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from llmfleet.cli.main import main


def test_compare_writes_table_report_and_plots(tmp_path: Path) -> None:
    # its own process, as a user runs it: the round-robin run forks workers, and a test process that
    # already holds gRPC threads (other tests') is no place to fork from
    out = tmp_path / "cmp"
    argv = ["sim", "--synthetic", "400", "--rate", "40", "--cluster", "4xA100-80GB",
            "--compare", "fcfs-rr", "fcfs-jsq", "--workers", "2", "--out", str(out)]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "llmfleet.cli.main", *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    table = done.stdout
    assert "fcfs-rr" in table and "fcfs-jsq" in table
    report = json.loads((out / "report.json").read_text())
    runs = {r["policy"]["name"]: r for r in report["runs"]}
    assert runs["fcfs-rr"]["overall"]["completed"] == 400
    assert runs["fcfs-rr"]["cluster"]["workers"] == 2  # round robin: split across processes
    assert runs["fcfs-jsq"]["cluster"]["workers"] == 1  # JSQ reads load: serial
    assert list(out.glob("*.png"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "zero"], "--workers must be 'auto' or a positive integer"),
        (["--workers", "0"], "--workers must be 'auto' or a positive integer"),
        (["--policy", "nope"], "nope"),
        (["--cluster", "4xTPU-v9"], "TPU-v9"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    rc = main(["sim", "--synthetic", "10", "--out", str(tmp_path), *argv])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_an_old_flag_is_a_usage_error_naming_the_new(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["sim", "--synthetic", "10", "--out", str(tmp_path), "--local", "static_sls"])
    assert e.value.code == 2 and "--local was renamed: write --engine-policy" in capsys.readouterr().err


def test_cluster_config_services_slos_and_limits(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--cluster-config``: a live config's services with their SLOs (all three papers' attainment)."""
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(
        "services:\n"
        "  chat: {model: demo, slo: {ttft_s: 2.0, tpot_s: 0.2, latency_scale: 4, deadline_s: 60}}\n"
        "models:\n"
        "  demo: {source: meta-llama/Llama-2-7b-hf, sim_model: llama2-7b}\n"
        "engines:\n"
        "  e0: {models: [demo], max_batch_requests: 64, policy: fcfs}\n"
    )
    out = tmp_path / "out"
    rc = main(["sim", "--synthetic", "50", "--rate", "5", "--cluster", "1xA100-80GB", "--cluster-config", str(cfg),
               "--policy", "fcfs-rr", "--no-plots", "--workers", "1", "--out", str(out)])  # fmt: skip
    assert rc == 0
    assert "chat→llama2-7b" in capsys.readouterr().err
    (run,) = json.loads((out / "report.json").read_text())["runs"]
    assert set(run["overall"]["slo"]) == {"seallm", "aladdin", "uellm"}  # each objective the config sets
    assert run["overall"]["completed"] == 50


def test_cluster_config_model_outside_the_catalog(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text("services: {chat: {model: mine}}\nmodels: {mine: {source: ./ckpt}}\n")
    rc = main(["sim", "--synthetic", "10", "--cluster-config", str(cfg), "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"cluster config {cfg}: service 'chat': model 'mine' (source ./ckpt) is not in" in err
    assert "give it a sim_model: one of [" in err
    cfg.write_text("services: {chat: {model: mine}}\nmodels: {mine: {source: ./ckpt, sim_model: gpt-5}}\n")
    assert main(["sim", "--synthetic", "10", "--cluster-config", str(cfg), "--out", str(tmp_path)]) == 2
    assert "models.mine.sim_model: unknown model 'gpt-5'" in capsys.readouterr().err


def test_shipped_configs_load_for_the_simulator() -> None:
    from llmfleet.config import ClusterConfig
    from llmfleet.sim.spec import from_cluster_config, load_services

    deploy = Path(__file__).resolve().parents[3] / "deploy" / "local"
    services, _ = from_cluster_config(ClusterConfig.load(deploy / "cluster.yaml"))
    assert [s.model for s in services] == ["tiny-llama", "tiny-qwen2"]  # catalog names already
    services, engine = load_services(deploy / "sim-services.yaml")
    assert services[0].slo.tpot_s == 0.015 and engine.max_batch_requests == 256
