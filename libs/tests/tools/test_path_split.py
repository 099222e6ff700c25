"""tools.bench.path_split: the schedulers' TTFT histogram read from /metrics text, and the path's parts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from tools.bench.path_split import SCHEDULER_TTFT, histogram_totals, markdown, split


def test_histogram_totals_sum_every_label_set_of_the_named_histogram() -> None:
    registry = CollectorRegistry()
    ttft = Histogram(SCHEDULER_TTFT, "ttft", ["service"], registry=registry)
    other = Histogram("llmfleet_scheduler_tpot_seconds", "tpot", ["service"], registry=registry)
    for service, values in {"chat": (0.1, 0.2), "code": (0.3,)}.items():
        for v in values:
            ttft.labels(service).observe(v)
    other.labels("chat").observe(9.0)
    total, count = histogram_totals(generate_latest(registry).decode(), SCHEDULER_TTFT)
    assert count == 3 and abs(total - 0.6) < 1e-9
    assert histogram_totals(generate_latest(registry).decode(), "absent_seconds") == (0.0, 0.0)


def test_split_and_markdown() -> None:
    parts = split(94.24, 90.91, 83.69)
    assert parts == {"client_scheduler_ms": 3.33, "scheduler_engine_ms": 7.22}
    row = {"client_ms": 94.24, "scheduler_ms": 90.91, "engine_ms": 83.69, **parts}
    md = markdown([row], "4 emulated A100-80GB, jsq, 32 conversations/s")
    assert "| 1 | 94.24 | 90.91 | 83.69 | 3.33 | 7.22 |" in md
