"""The Azure trace loader: parsing, ordering, windowing, zero outputs and error messages."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from llmfleet.workload import TraceFormatError, load_azure_trace, read_azure_trace

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
# Line 5 is out of order; line 4 generated 0 tokens; line 3 is 0.5000001 s after line 2.
ROWS = (
    "2023-11-16 18:15:46.6805900,374,44\n"  # line 2: t = 0
    "2023-11-16 18:15:47.1805901,100,10\n"  # line 3: t = 0.5000001
    "2023-11-16 18:15:48.6805900,200,0\n"  # line 4: t = 2.0
    "2023-11-16 18:15:50.0000000,50,5\n"  # line 5: t = 3.31941
    "2023-11-16 18:15:46.9805900,60,6\n"  # line 6: t = 0.3
)


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_parses_seven_digit_fractions_and_sorts(tmp_path):
    w = load_azure_trace(write(tmp_path, HEADER + ROWS), service="code", model="m7b")
    assert [r.request_id for r in w] == ["azure-2", "azure-6", "azure-3", "azure-4", "azure-5"]
    arrivals = [r.arrival_s for r in w]
    assert arrivals == pytest.approx([0.0, 0.3, 0.5000001, 2.0, 3.31941], abs=1e-12)
    assert [(r.prompt_tokens, r.output_tokens) for r in w] == [
        (374, 44),
        (60, 6),
        (100, 10),
        (200, 1),
        (50, 5),
    ]
    assert {(r.service, r.model) for r in w} == {("code", "m7b")}


def test_read_returns_raw_records_with_file_lines(tmp_path):
    recs = read_azure_trace(write(tmp_path, HEADER + ROWS))
    assert [r.line for r in recs] == [2, 6, 3, 4, 5]
    assert recs[3].output_tokens == 0  # as written; clamping is load_azure_trace's
    assert read_azure_trace(write(tmp_path, HEADER, "empty.csv")) == ()


def test_zero_output_clamp_skip_error(tmp_path, caplog):
    path = write(tmp_path, HEADER + ROWS)
    with caplog.at_level(logging.INFO, logger="llmfleet.workload.azure_trace"):
        clamped = load_azure_trace(path)
    assert next(r for r in clamped if r.request_id == "azure-4").output_tokens == 1
    assert "1 row(s) with GeneratedTokens=0 clamped to 1" in caplog.text
    skipped = load_azure_trace(path, zero_output="skip")
    assert len(skipped) == 4 and "azure-4" not in {r.request_id for r in skipped}
    with pytest.raises(TraceFormatError, match=r"trace\.csv:4: GeneratedTokens is 0") as e:
        load_azure_trace(path, zero_output="error")
    assert e.value.line == 4
    with pytest.raises(ValueError, match="zero_output"):
        # a wrong value on purpose: the check under test
        load_azure_trace(path, zero_output="drop")  # type: ignore[arg-type]


def test_window_rate_scale_and_limit_arithmetic(tmp_path):
    path = write(tmp_path, HEADER + ROWS)
    # Trace offsets 0, 0.3, 0.5000001, 2.0, 3.31941; window [0.4, 3.0) keeps 0.5000001 and 2.0.
    win = load_azure_trace(path, start_s=0.4, end_s=3.0)
    assert [r.request_id for r in win] == ["azure-3", "azure-4"]
    assert [r.arrival_s for r in win] == pytest.approx([0.1000001, 1.6], abs=1e-12)
    fast = load_azure_trace(path, start_s=0.4, end_s=3.0, rate_scale=2.0)
    assert [r.arrival_s for r in fast] == pytest.approx([0.05000005, 0.8], abs=1e-12)
    slow = load_azure_trace(path, rate_scale=0.5)
    assert slow.duration_s == pytest.approx(2 * 3.31941)
    assert [r.request_id for r in load_azure_trace(path, start_s=0.4, limit=1)] == ["azure-3"]
    assert len(load_azure_trace(path, limit=0)) == 0
    # limit counts kept rows: with skipping, the zero-output row does not use up the limit.
    assert [r.request_id for r in load_azure_trace(path, start_s=1.0, limit=1, zero_output="skip")] == [
        "azure-5"
    ]
    for bad in [{"rate_scale": 0.0}, {"start_s": 2.0, "end_s": 1.0}, {"limit": -1}]:
        with pytest.raises(ValueError):
            load_azure_trace(path, **bad)


def test_numeric_timestamps_extra_columns_any_order_bom(tmp_path):
    text = "\ufeffGeneratedTokens, ContextTokens ,TIMESTAMP,note\n3,30,10.5,x\n4,40,12.0,y\n\n"
    w = load_azure_trace(write(tmp_path, text))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in w] == [(0.0, 30, 3), (1.5, 40, 4)]


def test_ties_keep_file_order(tmp_path):
    rows = [f"2023-11-16 18:00:{s:02d}.0,1,1\n" for s in range(8)] + ["2023-11-16 18:00:00.0,2,2\n"] * 3
    w = load_azure_trace(write(tmp_path, HEADER + "".join(rows)))
    assert [r.request_id for r in w][:4] == ["azure-2", "azure-10", "azure-11", "azure-12"]


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.csv"):
        load_azure_trace(tmp_path / "missing.csv")


def test_renamed_column_lists_expected_and_found(tmp_path):
    path = write(tmp_path, "TIMESTAMP,PromptTokens,GeneratedTokens\n2023-11-16 18:15:46.1,1,1\n")
    with pytest.raises(
        ValueError, match=r"missing column\(s\) \['ContextTokens'\].*found \['TIMESTAMP', 'PromptTokens'"
    ):
        load_azure_trace(path)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ("2023-13-40 18:15:46.1,1,1", r"bad TIMESTAMP '2023-13-40 18:15:46.1'"),
        ("2023-11-16 25:15:46.1,1,1", r"bad TIMESTAMP"),
        ("yesterday,1,1", r"bad TIMESTAMP 'yesterday'"),
        ("17.5,1,1", r"bad TIMESTAMP '17.5' \(this file's timestamps are a datetime\)"),
        ("2023-11-16 18:15:47.1,12.5,1", r"ContextTokens must be an integer, got '12.5'"),
        ("2023-11-16 18:15:47.1,1,-3", r"GeneratedTokens must be >= 0, got -3"),
        ("2023-11-16 18:15:47.1,1", r"expected 3 fields, got 2"),
        ("2023-11-16 18:15:47.1,1,1,9", r"expected 3 fields, got 4"),
    ],
)
def test_malformed_row_names_file_line_and_value(tmp_path, row, match):
    path = write(tmp_path, HEADER + "2023-11-16 18:15:46.6805900,374,44\n" + row + "\n")
    with pytest.raises(TraceFormatError, match=rf"trace\.csv:3: {match}") as e:
        read_azure_trace(path)
    assert e.value.line == 3 and e.value.path == path
    assert isinstance(e.value, ValueError)


def test_line_numbers_count_blank_lines(tmp_path):
    path = write(tmp_path, HEADER + "1.0,1,1\n\n2.0,x,1\n")
    with pytest.raises(TraceFormatError, match=r":4: ContextTokens must be an integer, got 'x'"):
        read_azure_trace(path)


def test_a_service_column_labels_each_request(tmp_path):
    text = "TIMESTAMP,ContextTokens,GeneratedTokens,Service\n1.5,10,2,s01\n0.5,20,3,s00\n2.0,30,4,\n"
    w = load_azure_trace(write(tmp_path, text), service="default")
    assert [(r.prompt_tokens, r.service) for r in w.requests] == [(20, "s00"), (10, "s01"), (30, "default")]
    assert [r.service for r in read_azure_trace(write(tmp_path, text, "b.csv"))] == ["s00", "s01", ""]
