"""Smoke test of the paper reproduction benchmark (tools/bench/papers): every scenario at tiny scale
runs, its rows cover every (rate, policy) with sane metrics, and the driver writes the JSON, markdown and
one PNG per paper. The headline numbers are not checked here (they need the full sweep)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

RUN = Path(__file__).resolve().parents[3] / "tools" / "bench" / "papers" / "run.py"


def _synthetic_data(root: Path) -> tuple[Path, Path]:
    """A small Azure-format trace (one hour, conv-like lengths) and an Alpaca-style dataset: the
    smoke test must not need ../shared."""
    rng = np.random.default_rng(0)
    n = 8000  # the Aladdin scenario trains its predictor on 5,000 of them
    t = np.sort(rng.uniform(0, 3600, n))
    prompts = np.clip(rng.lognormal(6.5, 0.9, n), 4, 4000).astype(int)
    outputs = np.clip(rng.lognormal(5.0, 0.9, n), 1, 1500).astype(int)
    base = datetime(2023, 11, 16, 18, 0, 0)
    trace = root / "trace.csv"
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for ts, p, o in zip(t, prompts, outputs, strict=True):
        lines.append(f"{(base + timedelta(seconds=float(ts))).strftime('%Y-%m-%d %H:%M:%S.%f')},{p},{o}")
    trace.write_text("\n".join(lines) + "\n")
    words = ["explain", "list", "write", "the", "model", "story", "data", "why", "how", "a"]
    items = [
        {
            "instruction": " ".join(rng.choice(words, size=int(rng.integers(3, 15)))),
            "input": "",
            "output": " ".join(rng.choice(words, size=int(rng.integers(1, 120)))),
        }
        for _ in range(300)
    ]
    alpaca = root / "alpaca.json"
    alpaca.write_text(json.dumps(items))
    return trace, alpaca


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("papers_bench_run", RUN)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    mod.package()  # registers the scenario package so its modules import by name
    common = importlib.import_module(mod.PACKAGE + ".common")
    common.TRACE, common.ALPACA = _synthetic_data(tmp_path_factory.mktemp("papers-data"))
    yield mod
    sys.modules.pop(spec.name, None)
    sys.modules.pop(mod.PACKAGE, None)
    for name in [n for n in sys.modules if n.startswith(mod.PACKAGE + ".")]:
        sys.modules.pop(name)


@pytest.fixture(scope="module")
def results(bench):
    return {
        name: bench.scenario(name).run(tiny=True, log=lambda _msg: None) for name in bench.package().SCENARIOS
    }


def _frac(x) -> bool:
    return x is None or 0.0 <= x <= 1.0


def test_every_scenario_has_the_common_shape(results):
    assert list(results) == ["seallm", "aladdin", "scls", "uellm"]
    for name, res in results.items():
        assert res["paper"] == name
        for key in ("title", "setup", "rows", "summary", "goal", "claim", "ours", "notes", "wall_s"):
            assert key in res, (name, key)
        assert res["rows"], name
        g = res["goal"]
        assert isinstance(g["met"], bool) and g["text"] and g["ours_text"]
        assert res["setup"]["cost model"].startswith("roofline")
        json.dumps(res)  # JSON-ready


@pytest.mark.parametrize("name", ["seallm", "scls", "uellm"])
def test_rate_sweeps_cover_every_policy_with_sane_metrics(results, bench, name):
    res = results[name]
    policies = list(dict.fromkeys(r["policy"] for r in res["rows"]))
    rates = {r["rate_rps"] for r in res["rows"]}
    assert len(res["rows"]) == len(policies) * len(rates)  # same workload per rate for every policy
    for rate in rates:
        reqs = {r["requests"] for r in res["rows"] if r["rate_rps"] == rate}
        assert len(reqs) == 1 and reqs.pop() > 0
    for r in res["rows"]:
        assert r["failed"] == 0 and r["completed"] == r["requests"], r
        assert 0 < r["latency_mean_s"] <= r["latency_p99_s"] + 1e-9
        assert r["throughput_rps"] > 0 and r["throughput_tokens_per_s"] > 0
        for k in ("slo_seallm", "slo_aladdin", "slo_uellm"):
            assert _frac(r[k])
    expected = {
        "seallm": {"vllm", "alpaserve", "muxserve", "seallm-colocated", "seallm"},
        "scls": {"scls", "scls-keep", "scls-local", "sls", "cb"},
        "uellm": {"slo_odbs", "slo_odbs-authors", "slo_dbs", "odbs", "slo_odbs-b64", "fifo", "fifo-cm", "s3"},
    }[name]
    assert set(policies) == expected


def test_seallm_services_and_normalized_latency(results):
    res = results["seallm"]
    # the paper's four models on k-means clusters of conv ∪ LongBench-like lengths, shortest first
    assert [s["model"] for s in res["services"]] == ["opt-6.7b", "llama2-7b", "llama2-13b", "llama2-70b"]
    assert res["services"][-1]["mean_prompt"] > 2000 and res["services"][-1]["mean_output"] < 100
    assert math.isclose(sum(s["share"] for s in res["services"]), 1.0)
    assert max(s["share"] for s in res["services"]) > 0.4  # Zipf popularity: unequal shares
    assert res["plans"] and all(p["plan"] for p in res["plans"].values())  # Algorithm 1 placed them
    for r in res["rows"]:
        assert r["norm_latency_mean"] >= 0.99  # a request cannot beat its own solo execution time
        assert r["gpus"] <= 32


def test_aladdin_search_reaches_the_target(results):
    res = results["aladdin"]
    configs = {r["config"] for r in res["rows"]}
    assert {"aladdin", "aladdin-strict", "aladdin-search", "jsq-opt", "vllm-default"} <= configs
    for r in res["rows"]:
        if r["workers"] is None:
            continue
        assert r["gpus"] == r["workers"] * r["tp"]
        if "pool_workers" in r:  # best fit that opens workers: its count, whatever it attains
            assert r["workers"] <= r["pool_workers"] and r["p100_met"] == (r["gpus_p100"] is not None)
            continue
        assert r["attainment"] >= 0.99
        assert 0 < r["gpus_used"] <= r["gpus"]
        below = [int(n) for n, att in r["tried"].items() if att < 0.99]
        assert all(n < r["workers"] for n in below) or r["tried"][str(r["workers"])] >= 0.99
    assert res["summary"]["per_rate"]


def test_uellm_violations_are_fractions(results):
    for r in results["uellm"]["rows"]:
        assert 0.0 <= r["slo_violation"] <= 1.0
        assert math.isclose(r["slo_violation"] + r["slo_uellm"], 1.0)


def test_markdown_and_plots(results, bench, tmp_path):
    for name, res in results.items():
        mod = bench.scenario(name)
        md = mod.markdown(res)
        assert md.startswith(f"## {res['title']}") and "Paper's claim:" in md and "Goal:" in md
        paths = mod.plot(res, tmp_path)
        assert paths and all(
            p.name.startswith(name) and p.suffix == ".png" and p.stat().st_size > 0 for p in paths
        )


def test_driver_writes_json_markdown_and_pngs(bench, tmp_path):
    assert bench.main(["--tiny", "--only", "uellm", "--only", "scls", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "papers.json").read_text())
    assert set(doc["papers"]) == {"uellm", "scls"} and "roofline" in doc["meta"]["cost_models"]
    md = (tmp_path / "papers.md").read_text()
    assert "| paper | goal | ours | met |" in md and "## SCLS" in md and "## UELLM" in md
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["scls_sweep.png", "uellm_sweep.png"]
