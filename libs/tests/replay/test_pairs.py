"""Two runs' requests.jsonl paired by request id: the differences B − A, the cached-token agreement,
requests in one run only, failed rows left out, a multi-run file read at one run, bad rows named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmfleet.cli.main import main
from llmfleet.replay.pairs import markdown, pair, read_rows


def _sim(rid: str, arrival: float, ttft: float, latency: float, cached: int, policy: str = "fcfs") -> dict:
    return {
        "policy": policy, "request_id": rid, "service": "chat", "model": "m", "arrival_s": arrival,
        "prompt_tokens": 100, "output_tokens": 10, "instance": "m-0", "first_token_s": arrival + ttft,
        "finish_s": arrival + latency, "failed": "", "cached_tokens": cached,
    }  # fmt: skip


def _live(rid: str, arrival: float, ttft: float, engine: float | None, latency: float, cached: int) -> dict:
    row = _sim(rid, arrival, ttft, latency, cached)
    del row["policy"]
    return {**row, "planned_s": arrival, "engine_ttft_s": engine, "scheduler_ttft_s": None}


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_each_request_is_compared_with_itself(tmp_path: Path) -> None:
    sim = _write(
        tmp_path / "sim.jsonl",
        [_sim(f"r{i}", float(i), 0.100, 1.0, 64 if i < 8 else 0) for i in range(10)]
        + [_sim("only-sim", 0.0, 0.1, 1.0, 0)],
    )
    live_rows = [
        _live(f"r{i}", i + 0.5, 0.110 + 0.001 * i, 0.104, 1.02, 64 if i < 6 else 0) for i in range(10)
    ]
    live_rows += [
        _live("only-live", 0.0, 0.1, 0.1, 1.0, 0),
        {**_live("r-failed", 0, 0.1, 0.1, 1, 0), "failed": "x"},
    ]
    live = _write(tmp_path / "live.jsonl", live_rows)

    p = pair(read_rows(sim, "fcfs"), read_rows(live, "live"))

    assert (p.paired, p.only_a, p.only_b) == (10, 1, 1)  # the failed row is not served: left out
    ttft = p.diffs["ttft_s"]  # 10 … 19 ms later live, each from its own arrival
    assert ttft["n"] == 10 and ttft["p50"] == pytest.approx(0.0145) and ttft["mean"] == pytest.approx(0.0145)
    assert p.diffs["engine_ttft_s"]["p50"] == pytest.approx(0.004)  # a simulated row's engine TTFT: its TTFT
    assert p.diffs["latency_s"]["p99"] == pytest.approx(0.02)
    assert p.same_cached_share == pytest.approx(0.8)  # r6 and r7 found 64 tokens in the sim, none live
    assert p.engine_ttft_same_cached["n"] == 8 and p.engine_ttft_other_cached["n"] == 2
    text = markdown(p, "sim", "live")
    assert "10 requests served in both (1 in A only, 1 in B only)" in text
    assert "| engines' TTFT | 10 | +4.0 |" in text and "80.0% of the pairs" in text


def test_a_file_of_several_runs_is_read_at_one_and_an_unreported_engine_ttft_is_not_counted(
    tmp_path: Path,
) -> None:
    sim = _write(tmp_path / "sim.jsonl", [_sim("r0", 0, 0.1, 1, 0, "a"), _sim("r0", 0, 0.3, 1, 0, "b")])
    live = _write(tmp_path / "live.jsonl", [_live("r0", 0, 0.2, None, 1, 0)])
    p = pair(read_rows(sim, "b"), read_rows(live))
    assert p.diffs["ttft_s"]["mean"] == pytest.approx(-0.1)  # against run b's 0.3 s, not a's
    assert p.diffs["engine_ttft_s"] == {"n": 0}  # the live engine did not report its TTFT
    assert "| engines' TTFT | 0 | – |" in markdown(p, "a", "b")


def test_a_simulated_requests_engine_ttft_counts_from_its_dispatch(tmp_path: Path) -> None:
    held = {**_sim("r0", 1.0, 0.5, 2.0, 0), "dispatched_s": 1.4}  # held 0.4 s in the simulated scheduler
    sim = _write(tmp_path / "sim.jsonl", [held, _sim("r1", 2.0, 0.1, 1.0, 0)])  # r1: no dispatch time
    live = _write(
        tmp_path / "live.jsonl", [_live("r0", 1.0, 0.5, 0.12, 1.0, 0), _live("r1", 2.0, 0.1, 0.1, 1.0, 0)]
    )
    p = pair(read_rows(sim), read_rows(live))
    # r0: 0.12 live against 0.5 − 0.4 (not 0.5: −0.38); r1: 0.1 against its TTFT, 0.1
    assert p.diffs["engine_ttft_s"]["mean"] == pytest.approx(0.01) and p.diffs["ttft_s"]["mean"] == 0.0


@pytest.mark.parametrize(
    ("text", "why"), [("{not json\n", "1: not JSON"), ('{"arrival_s": 1}\n', "1: a row needs a request_id")]
)
def test_a_bad_row_is_named_by_its_line(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=why):
        read_rows(path)


def _report(path: Path, name: str) -> None:
    path.mkdir()
    run = {
        "policy": {"name": name},
        "overall": {
            "requests": 2,
            "completed": 2,
            "failed": 0,
            "ttft_s": {"mean": 0.1, "p50": 0.1, "p99": 0.1},
        },
        "cluster": {"gpus_in_use": [[0.0, 1]], "makespan_s": 2.0},
    }
    (path / "report.json").write_text(json.dumps({"runs": [run]}))


def test_compare_pairs_the_requests_when_both_reports_have_them(tmp_path: Path, capsys) -> None:
    _report(tmp_path / "sim", "fcfs")
    _report(tmp_path / "live", "live")
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "sim"), str(tmp_path / "live"), "--out", str(out)]) == 0
    assert "per_request" not in capsys.readouterr().out
    assert json.loads((out / "compare.json").read_text())["per_request"] is None  # no requests.jsonl

    _write(tmp_path / "sim" / "requests.jsonl", [_sim("r0", 0, 0.1, 1, 0), _sim("r1", 1, 0.1, 1, 0)])
    _write(
        tmp_path / "live" / "requests.jsonl",
        [_live("r0", 0, 0.12, 0.11, 1, 0), _live("r1", 1, 0.12, 0.11, 1, 0)],
    )
    assert (
        main(["compare", str(tmp_path / "sim" / "report.json"), str(tmp_path / "live"), "--out", str(out)])
        == 0
    )
    assert "per request: 2 paired; engines' TTFT B − A p50 +10.0 ms" in capsys.readouterr().out
    doc = json.loads((out / "compare.json").read_text())
    assert doc["per_request"]["paired"] == 2 and doc["per_request"]["same_cached_share"] == 1.0
    assert "## Per request" in (out / "compare.md").read_text()

    (tmp_path / "live" / "requests.jsonl").write_text("{broken\n")
    assert main(["compare", str(tmp_path / "sim"), str(tmp_path / "live"), "--out", str(out)]) == 2
    assert "requests.jsonl:1: not JSON" in capsys.readouterr().err
