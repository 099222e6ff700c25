"""`llmfleet load --trace` against a real local cluster, then `llmfleet sim` on the same trace and
services and `llmfleet compare` of the two reports."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def test_replay_a_trace_and_compare_with_the_simulator(cluster, tmp_path):
    rows = [(0.25 * i, 5 + (7 * i) % 20, 2 + i % 6) for i in range(16)]
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},{a},{b}\n" for t, a, b in rows)
    )
    services = tmp_path / "services.yaml"  # chat serves the endless llama: every output reaches max_tokens
    services.write_text("services:\n  - {name: chat, model: tiny-llama, slo: {ttft_s: 2.0, tpot_s: 0.2}}\n")
    live = tmp_path / "live"
    load = subprocess.run(
        [
            str(BIN / "llmfleet"), "load", "--trace", str(trace), "--services", str(services),
            "--etcd", cluster.etcd.endpoint, "--prefix", cluster.prefix, "--scheduler", cluster.scheduler,
            "--out", str(live), "--report-s", "2", "--no-plots", "--records",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert load.returncode == 0, load.stdout + load.stderr
    assert "16/16 done" in load.stdout
    run = json.loads((live / "report.json").read_text())["runs"][0]
    assert run["overall"]["completed"] == 16 and run["overall"]["failed"] == 0
    assert run["live"]["short_outputs"] == 0  # max_tokens = the trace's output length, reached
    assert run["cluster"]["gpus_in_use"][0][1] == 2  # both engines host tiny-llama
    assert {p["instance_id"] for p in run["plan"] if "tiny-llama" in p["models"]} == {"engine-0", "engine-1"}
    assert run["overall"]["slo"]["seallm"] is not None  # tiny-llama has a cost model (cpu)
    engines, path = run["live"]["engine_ttft_s"], run["live"]["path_ttft_s"]
    assert engines["n"] == 16 and 0 < engines["p50"] < run["overall"]["ttft_s"]["p50"]  # the engines' own
    assert path["n"] == 16 and path["p50"] > 0  # the SDK → scheduler → engine path added to each
    parts = run["live"]["path_parts_s"]  # split at the scheduler: its own TTFT and time to dispatch
    assert all(parts[k]["n"] == 16 for k in ("client_scheduler", "scheduler_dispatch", "scheduler_engine"))
    assert parts["client_scheduler"]["p50"] > 0 and parts["scheduler_engine"]["p50"] > 0
    assert sum(p["mean"] for p in parts.values()) == pytest.approx(path["mean"])
    assert "(the engines' own " in load.stdout
    records = [json.loads(line) for line in (live / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 16 and {r["instance"] for r in records} <= {"engine-0", "engine-1"}
    assert all(
        r["engine_ttft_s"] > 0 and r["first_token_s"] - r["arrival_s"] > r["engine_ttft_s"] for r in records
    )
    assert statistics.median(r["engine_ttft_s"] for r in records) == pytest.approx(engines["p50"])

    sim = tmp_path / "sim"
    out = subprocess.run(
        [
            str(BIN / "llmfleet"), "sim", "--trace", str(trace), "--services", str(services), "--cluster", "2xcpu",
            "--policy", "vllm", "--out", str(sim), "--no-plots", "--workers", "1", "--records",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    cmp = subprocess.run(
        [str(BIN / "llmfleet"), "compare", str(sim / "report.json"), str(live / "report.json"), "--out", str(tmp_path / "cmp")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cmp.returncode == 0, cmp.stderr
    assert "latency mean s" in cmp.stdout and "same placement plans" in cmp.stdout
    assert (tmp_path / "cmp" / "gpus_in_use.png").stat().st_size > 0
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    rows = {r["figure"]: r for r in doc["rows"]}
    assert rows["completed"]["a"] == rows["completed"]["b"] == 16
    assert rows["engines' TTFT p50 s"]["b"] == engines["p50"]
    pairs = doc["per_request"]  # both reports have their requests beside them: paired by id
    assert pairs["paired"] == 16 and pairs["only_a"] == pairs["only_b"] == 0
    assert pairs["diffs"]["engine_ttft_s"]["n"] == 16 and pairs["diffs"]["ttft_s"]["n"] == 16
    assert "## Per request" in (tmp_path / "cmp" / "compare.md").read_text()
    assert "per request: 16 paired" in cmp.stdout
