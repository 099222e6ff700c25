"""tools.bench.path_split: the figures of one ``llmfleet load`` report run, and their table."""

from __future__ import annotations

from typing import Any

from tools.bench.path_split import PARTS, figures, markdown


def _d(mean: float, p50: float, n: int = 10) -> dict[str, Any]:
    return {"n": n, "mean": mean, "p50": p50}


def test_figures_and_markdown_read_the_reports_path_parts() -> None:
    run = {
        "overall": {"ttft_s": _d(0.0942, 0.083, 12)},
        "live": {
            "engine_ttft_s": _d(0.0837, 0.073),
            "path_ttft_s": _d(0.0105, 0.0093),
            "path_parts_s": {
                "client_scheduler": _d(0.0033, 0.003),
                "scheduler_dispatch": _d(0.0009, 0.0008),
                "scheduler_engine": _d(0.0063, 0.0055),
            },
        },
    }
    row = figures(run)
    assert row["requests"] == 12 and row["timed"] == 10
    assert row["client_mean_ms"] == 94.2 and row["engine_p50_ms"] == 73.0
    assert row["scheduler_engine_mean_ms"] == 6.3 and row["client_scheduler_p50_ms"] == 3.0
    md = markdown([row], "4 emulated A100-80GB, jsq, 32 conversations/s")
    assert "| 1 | 94.2 / 83.0 | 83.7 / 73.0 | 10.5 / 9.3 | 3.3 / 3.0 | 0.9 / 0.8 | 6.3 / 5.5 |" in md


def test_a_report_without_scheduler_figures_has_no_parts() -> None:
    run = {
        "overall": {"ttft_s": _d(0.1, 0.1)},
        "live": {
            "engine_ttft_s": _d(0.09, 0.09),
            "path_ttft_s": _d(0.01, 0.01),
            "path_parts_s": {p: _d(0.0, 0.0, 0) for p in PARTS},
        },
    }
    row = figures(run)
    assert row["path_mean_ms"] == 10.0 and all(row[f"{p}_mean_ms"] is None for p in PARTS)
