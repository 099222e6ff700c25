"""``llmfleet compare``: two small reports → the table, the files written, same/different plans, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmfleet.cli.compare import compare, load_run, plans_of
from llmfleet.cli.main import main


def _run(
    name: str, lat: float, gpus: list[list[float]], placement: list[dict] | None = None, **extra
) -> dict:
    run = {
        "policy": {"name": name},
        "overall": {
            "requests": 10, "completed": 10, "failed": 0,
            "latency_s": {"mean": lat, "p50": lat, "p99": 2 * lat},
            "normalized_latency": {"mean": 1.5, "p50": 1.2, "p99": 3.0},
            "ttft_s": {"mean": 0.1, "p50": 0.1, "p99": 0.2},
            "tpot_s": {"mean": 0.02, "p50": 0.02, "p99": 0.03},
            "slo": {"seallm": 0.9, "aladdin": 0.8},
        },
        "cluster": {"gpus_in_use": gpus, "mean_gpus_in_use": 2.5, "makespan_s": 10.0, "gpu_seconds": 25.0},
        "plan": [{"instance_id": "i0", "models": ["llama2-7b"], "tp": 1}],
        **extra,
    }  # fmt: skip
    if placement is not None:
        run["placement"] = placement
    return run


def _decision(t: float, plan: str, status: str = "applied") -> dict:
    return {"t": t, "plan": plan, "status": status, "gpus_in_use": 2, "moves": 1, "changes": [], "error": ""}


def _write(path: Path, *runs: dict) -> Path:
    path.write_text(json.dumps({"title": "t", "context": "", "runs": list(runs)}))
    return path


def test_compare_table_files_and_same_plans(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    grown = "2×tp1[llama2-7b]"
    sim = _run(
        "seallm", 1.0, [[0.0, 1], [5.0, 2]], [_decision(5.0, grown), _decision(6.0, grown, "unchanged")]
    )
    live = _run("live", 1.1, [[0.0, 1], [5.4, 2]], [_decision(5.3, grown)], live={"sent": 10})
    a, b = _write(tmp_path / "sim.json", sim), _write(tmp_path / "live.json", live)
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "latency mean s" in printed and "+10.0%" in printed and "same placement plans: yes" in printed
    md = (out / "compare.md").read_text()
    assert "| latency p99 s | 2 | 2.200 | 0.200 | +10.0% |" in md and "Same placement plans: yes" in md
    assert "| GPUs in use peak | 2 | 2 | 0 | +0.0% |" in md
    doc = json.loads((out / "compare.json").read_text())
    assert doc["same_plans"] is True and doc["plans_a"] == ["tp1[llama2-7b]", grown]
    png = (out / "gpus_in_use.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_different_plans_and_relative_difference() -> None:
    sim = _run("seallm", 2.0, [[0.0, 1]], [_decision(5.0, "2×tp1[llama2-7b]")])
    live = _run("live", 1.0, [[0.0, 1]], [])
    c = compare(sim, live, "sim", "live")
    assert not c.same_plans and c.plans_b == ["tp1[llama2-7b]"]
    row = {r.figure: r for r in c.rows}
    assert row["latency mean s"].rel == pytest.approx(-0.5) and row["failed"].rel is None  # 0 → no ratio
    assert row["placement decisions"].a == 1 and row["placement decisions"].b == 0
    assert "migrations executed" not in row  # neither report has one


def test_plans_of_collapses_repeats_and_skips_held_back_proposals() -> None:
    run = _run(
        "x", 1.0, [], [_decision(1, "A"), _decision(2, "A"), _decision(3, "B", "proposed"), _decision(4, "C")]
    )
    assert plans_of(run) == ["tp1[llama2-7b]", "A", "C"]


def test_a_run_is_picked_by_name(tmp_path: Path) -> None:
    p = _write(tmp_path / "r.json", _run("vllm", 1.0, []), _run("seallm", 2.0, []))
    assert load_run(p)[1]["policy"]["name"] == "vllm"
    assert load_run(p, "seallm")[1]["overall"]["latency_s"]["mean"] == 2.0
    (tmp_path / "d").mkdir()
    _write(tmp_path / "d" / "report.json", _run("live", 1.0, []))
    assert load_run(tmp_path / "d")[1]["policy"]["name"] == "live"  # a directory: its report.json


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "not a JSON report"),
        ('{"runs": []}', "expected {'runs': [...]}"),
    ],
)
def test_bad_reports_exit_2_naming_the_file(
    content: str | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    good = _write(tmp_path / "good.json", _run("x", 1.0, []))
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    assert main(["compare", str(good), str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and message in err


def test_unknown_run_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    p = _write(tmp_path / "r.json", _run("vllm", 1.0, []))
    assert main(["compare", str(p), str(p), "--run", "nope", "--out", str(tmp_path / "o")]) == 2
    assert "no run 'nope'; runs: vllm" in capsys.readouterr().err


def test_the_engines_ttft_is_the_live_reports_own_and_the_simulators_ttft() -> None:
    sim = _run("seallm", 1.0, [[0.0, 1]])
    engines = {"n": 10, "mean": 0.09, "p50": 0.08, "p99": 0.15}
    live = _run("live", 1.0, [[0.0, 1]], live={"sent": 10, "engine_ttft_s": engines})
    row = {r.figure: r for r in compare(sim, live, "sim", "live").rows}
    assert row["engines' TTFT p50 s"].a == pytest.approx(0.1)  # the simulator's TTFT
    assert row["engines' TTFT p50 s"].b == pytest.approx(0.08) and row["TTFT p50 s"].b == pytest.approx(0.1)
    assert row["engines' TTFT mean s"].rel == pytest.approx(-0.1)
    via_http = _run("live", 1.0, [[0.0, 1]], live={"sent": 10, "engine_ttft_s": {**engines, "n": 0}})
    row = {r.figure: r for r in compare(sim, via_http, "sim", "live").rows}
    assert row["engines' TTFT p50 s"].b is None  # no engine reported one: not the client's TTFT instead
