"""bench-prefix's live figures: the engines' own TTFT is a live report's per-request figure and a simulated
report's TTFT; a live run whose engines reported none has no such figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.bench.prefix_bench_live import live_figures
from tools.bench.prefix_bench_report import markdown


def _report(path: Path, ttft: dict, live: dict | None = None) -> Path:
    run = {
        "overall": {"requests": 4, "completed": 4, "failed": 0, "ttft_s": ttft, "slo": {"aladdin": 1.0}},
        "cluster": {"throughput_rps": 2.0, "throughput_tokens_per_s": 80.0},
    }
    if live is not None:
        run["live"] = live
    path.write_text(json.dumps({"runs": [run]}))
    return path


def test_the_engines_ttft_of_live_and_simulated_reports(tmp_path: Path) -> None:
    ttft = {"n": 4, "mean": 0.2, "p50": 0.18, "p99": 0.4}
    sim = live_figures(_report(tmp_path / "sim.json", ttft))
    assert (sim["engine_ttft_mean_s"], sim["engine_ttft_p50_s"]) == (0.2, 0.18)
    engines = {"n": 4, "mean": 0.15, "p50": 0.14, "p99": 0.3}
    live = live_figures(_report(tmp_path / "live.json", ttft, {"engine_ttft_s": engines}))
    assert live["engine_ttft_p50_s"] == pytest.approx(0.14) and live["ttft_p50_s"] == pytest.approx(0.18)
    http = live_figures(_report(tmp_path / "http.json", ttft, {"engine_ttft_s": {**engines, "n": 0}}))
    assert http["engine_ttft_p50_s"] is None and http["engine_ttft_mean_s"] is None


def test_the_live_sections_name_their_workload_and_compare_the_engines_ttft() -> None:
    figures = {"ttft_p50_s": 0.2, "engine_ttft_p50_s": 0.16, "output_tokens_per_s": 900.0}
    ratios = {
        "ttft_p50_s": 1.25, "engine_ttft_p50_s": 1.02, "output_tokens_per_s": 0.99,
        "window_tokens_per_s": 1.0, "ttft_mean_s": 1.3, "engine_ttft_mean_s": 1.04,
    }  # fmt: skip
    run = {"rate": 64, "live": figures, "sim": {"ttft_p50_s": 0.157}, "live_over_sim": ratios}
    section = {"gpus": 4, "unit": "users", "loads": {"slo": 64, "saturation": {}}, "ratios": {}}
    report = {"machine": "m", "emulated-users": {**section, "runs": {"slo": {"jsq/cache": run}}}}
    md = markdown(report)
    assert "the closed population of users" in md and "(users)" in md and "| users |" in md
    assert "| jsq/cache | 1.25 | 1.02 | 0.99 |" in md  # client TTFT, then the engines' own, live/sim
