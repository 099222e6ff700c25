"""``llmfleet sim --placement NAME --placement-interval-s S``: the placement loop from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmfleet.cli.main import main


def test_placement_loop_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "dyn"
    rc = main(["sim", "--synthetic", "300", "--rate", "10", "--cluster", "2xA100-80GB", "--policy", "fcfs-jsq",
               "--placement", "seallm", "--placement-interval-s", "10", "--adaptive-interval",
               "--placement-confirm-intervals", "2", "--out", str(out), "--workers", "2"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    (run,) = json.loads((out / "report.json").read_text())["runs"]
    assert (
        run["policy"]["placement"]["policy"] == "seallm" and run["policy"]["placement"]["interval_s"] == 10.0
    )
    decisions = run["placement"]
    assert decisions and 10.0 < decisions[0]["t"] < 11.0  # one interval after the first arrival
    assert all(d["status"] in ("applied", "unchanged", "proposed", "skipped") for d in decisions)
    assert decisions[1]["next_interval_s"] != 10.0  # the interval adapts (Eq. 8: ×0.9 or ×1.1)
    assert run["cluster"]["gpu_seconds"] > 0 and run["cluster"]["gpus_in_use"][0] == [0.0, 2]
    assert run["overall"]["completed"] == 300 and run["cluster"]["workers"] == 1
    assert "Placement decisions: fcfs-jsq" in (out / "report.md").read_text()
    assert (out / "gpus_in_use.png").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--placement", "nope"], "unknown placement policy 'nope'; valid: ['aladdin'"),
        (["--placement-interval-s", "0"], "argument --placement-interval-s: Input should be greater than 0"),
        (["--adaptive-interval"], "adaptive_interval needs interval_s"),
        (["--placement-processes", "0"], "--placement-processes must be >= 1"),
    ],
)
def test_bad_placement_arguments_exit_2(argv: list[str], message: str, tmp_path: Path, capsys) -> None:
    try:  # a flag's own type check exits in argparse, a setting refused together returns 2
        rc = main(["sim", "--synthetic", "10", "--out", str(tmp_path), *argv])
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    assert message in capsys.readouterr().err
