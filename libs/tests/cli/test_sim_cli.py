"""``llmfleet sim``: the table, the report files, worker selection and bad input (in process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmfleet.cli.main import main


def test_compare_writes_table_report_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cmp"
    rc = main(["sim", "--synthetic", "400", "--rate", "40", "--cluster", "4xA100-80GB",
               "--compare", "fcfs-rr", "fcfs-jsq", "--workers", "2", "--out", str(out)])  # fmt: skip
    assert rc == 0
    table = capsys.readouterr().out
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
