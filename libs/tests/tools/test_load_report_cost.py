"""bench-load-reports: real WatchLoad streams from real engine servicers reach a LoadBook at the
interval asked for, and the row states what they cost."""

from __future__ import annotations

from llmfleet.load.monitor import report_from_proto
from llmfleet_engine.servicer import snapshot_to_proto

from tools.bench.load_report_cost import busy_snapshot, markdown, measure


def test_the_busy_snapshot_reads_back_as_the_engine_holds_it() -> None:
    report = report_from_proto(snapshot_to_proto(busy_snapshot(64), "e"))
    assert (report.running, report.waiting, len(report.request_ids)) == (48, 16, 64)
    (pool,) = report.adapter_pools
    assert (pool.base, pool.slots, len(pool.resident)) == ("llama2-7b", 8, 8)


def test_two_engines_stream_at_the_interval_and_the_row_counts_them() -> None:
    row = measure(engines=2, requests=16, interval_s=0.1, seconds=1.0)
    assert 10 <= row["reports_per_s"] <= 25  # 2 engines x 10 per second
    assert row["scheduler_cpu_per_s"] > 0 and row["engines_cpu_per_s"] > 0
    # the rate in the row is rounded to 4 decimals, the bytes are from the rate as measured
    assert (
        abs(row["bytes_per_s"] - row["snapshot_bytes"] * row["reports_per_s"])
        <= row["snapshot_bytes"] * 1e-4 + 1
    )
    assert "| 2 | 16 | 0.1 |" in markdown([row], 1.0)
