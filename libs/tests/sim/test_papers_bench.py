"""Smoke test of the paper reproduction benchmark (tools/bench/papers): every scenario at tiny scale
runs, its rows cover every (rate, policy) with sane metrics, and the driver writes the JSON, markdown and
one PNG per paper. The headline numbers are not checked here (they need the full sweep)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from llmfleet.costmodel.sources import DEFAULT_COST_SOURCE


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
    from tools.bench.papers import common, run

    trace, alpaca = _synthetic_data(tmp_path_factory.mktemp("papers-data"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(common, "TRACE", trace)
        mp.setattr(common, "ALPACA", alpaca)
        yield run


@pytest.fixture(scope="module")
def results(bench):
    return {
        name: bench.scenario(name).run(tiny=True, log=lambda _msg: None) for name in bench.package().SCENARIOS
    }


def _frac(x) -> bool:
    return x is None or 0.0 <= x <= 1.0


def test_every_scenario_has_the_common_shape(results):
    assert list(results) == ["seallm", "aladdin", "scls", "uellm", "mell"]
    for name, res in results.items():
        assert res["paper"] == name
        for key in ("title", "setup", "rows", "summary", "goal", "claim", "ours", "notes", "wall_s"):
            assert key in res, (name, key)
        assert res["rows"], name
        g = res["goal"]
        assert isinstance(g["met"], bool) and g["text"] and g["ours_text"]
        assert res["setup"]["cost model"].startswith(DEFAULT_COST_SOURCE)
        json.dumps(res)  # JSON-ready


@pytest.mark.parametrize("name", ["seallm", "scls", "uellm"])
def test_rate_sweeps_cover_every_policy_with_sane_metrics(results, bench, name):
    res = results[name]
    policies = list(dict.fromkeys(r["policy"] for r in res["rows"]))
    groups: dict = {}  # SeaLLM: per (lengths, model assignment, rate); the others per rate
    for r in res["rows"]:
        groups.setdefault((r.get("lengths"), r.get("assignment"), r["rate_rps"]), []).append(r)
    for key, rows in groups.items():
        assert len({r["policy"] for r in rows}) == len(rows), key  # each policy once
        reqs = {r["requests"] for r in rows}
        assert len(reqs) == 1 and reqs.pop() > 0  # same workload for every policy
    if name != "seallm":
        assert len(res["rows"]) == len(policies) * len(groups)
    for r in res["rows"]:
        assert r["failed"] == 0 and r["completed"] == r["requests"], r
        assert 0 < r["latency_mean_s"] <= r["latency_p99_s"] + 1e-9
        assert r["throughput_rps"] > 0 and r["throughput_tokens_per_s"] > 0
        for k in ("slo_seallm", "slo_aladdin", "slo_uellm"):
            assert _frac(r[k])
    expected = {
        "seallm": {
            "vllm",
            "vllm-tp",
            "alpaserve",
            "muxserve",
            "seallm-colocated",
            "seallm",
            "seallm-f",
            "seallm-literal",
            "seallm-prefill_first",
        },
        "scls": {"scls", "scls-keep", "scls-local", "sls", "cb"},
        "uellm": {
            "UA",
            "UB",
            "UD",
            "S3",
            "Morphling",
            "Morphling-noprof",
            "slo_dbs",
            "odbs",
            "slo_odbs-authors",
            "fifo-cm",
            "s3-helr",
        },
    }[name]
    assert set(policies) == expected


def test_seallm_services_and_normalized_latency(results):
    res = results["seallm"]
    # the paper's four models, randomly assigned to k-means clusters of ShareGPT-like (or conv) ∪
    # LongBench-like lengths, shortest first
    for kind in ("sharegpt", "conv"):
        svcs = [s for s in res["services"] if s["lengths"] == kind and s["assignment"] == 0]
        assert sorted(s["model"] for s in svcs) == ["llama2-13b", "llama2-70b", "llama2-7b", "opt-6.7b"]
        assert svcs[-1]["mean_prompt"] > 2000 and svcs[-1]["mean_output"] < 100
        assert math.isclose(sum(s["share"] for s in svcs), 1.0)
        assert max(s["share"] for s in svcs) > 0.4  # Zipf popularity: unequal shares
    short = [s for s in res["services"] if s["lengths"] == "sharegpt"][:-1]
    assert all(s["mean_prompt"] < 1000 for s in short)  # Table 1's ShareGPT: 73 tokens in
    assert res["plans"] and all(p["plan"] for p in res["plans"].values())  # Algorithm 1 placed them
    for r in res["rows"]:
        if r["policy"] == "vllm":  # replicas at each model's reference TP: no request beats its solo time
            assert r["norm_latency_mean"] >= 0.99
        assert r["gpus"] <= 32 and r["load"] > 0
    tp = [r for r in res["rows"] if r["policy"] == "vllm-tp"]
    assert tp and all(r["gpus"] == 32 for r in tp)  # one TP-8 server per model


def test_seallm_goal_says_when_seallm_fails_requests(results, bench):
    import copy

    res = copy.deepcopy(results["seallm"])
    row = next(r for r in res["rows"] if r["policy"] == "seallm")
    row["failed"] = 5
    from tools.bench.papers import seallm_summary

    seallm_summary.summarize(res)
    assert (
        f"but SeaLLM fails 5/{row['requests']} (a0) requests at {row['rate_rps']:g} req/s"
        in res["goal"]["ours_text"]
    )
    assert res["notes"][0].startswith("SeaLLM's plan fails requests vLLM completes")


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


def test_uellm_deployments_follow_the_paper(results, bench):
    from tools.bench.papers import uellm_cluster as U

    devs = U.gpus()
    assert [round(d.mem_bandwidth / devs[0].mem_bandwidth, 2) for d in devs] == [1.0, 0.86, 0.71, 0.43]
    assert U.helr_deployment("llama2-7b", devs).stages == ((0, 32),)  # fits the fastest GPU alone
    assert U.default_deployment("llama2-7b", devs).stages == ((0, 8), (1, 8), (2, 8), (3, 8))
    rows = {r["policy"]: r for r in results["uellm"]["rows"]}
    assert (
        rows["UA"]["deployment"] == "GPU#0:28" and rows["S3"]["deployment"].count("GPU#") == 4
    )  # ChatGLM2-6B
    # Morphling: the profiling wait only adds latency, on the same deployment
    assert rows["Morphling"]["deployment"] == rows["Morphling-noprof"]["deployment"]
    assert rows["Morphling"]["latency_mean_s"] > rows["Morphling-noprof"]["latency_mean_s"]


def test_uellm_harness_follows_the_authors_scripts(results, bench):
    from tools.bench.papers import uellm_harness as H

    qs = [H.Query(10, lab, slo) for lab, slo in [(900, 1), (100, 50), (50, 350), (300, 1), (600, 100)] * 6]
    s3 = H.s3_groups(qs)  # by label, fewer than 20 a batch, labels' sum ≤ 1024
    assert all(len(g) <= 20 and (sum(q.label for q in g) <= 1024 or len(g) == 1) for g in s3)
    labels = [q.label for g in s3 for q in g]
    assert labels == sorted(labels) and len(labels) == len(qs)
    ua = H.uellm_groups(qs)  # by SLO + 0.5·label, at most 10 a batch
    keys = [q.slo + 0.5 * q.label for g in ua for q in g]
    assert keys == sorted(keys) and all(len(g) <= 10 for g in ua) and len(keys) == len(qs)
    g = [H.Query(30, 100, 1.0), H.Query(50, 40, 1.0)]
    assert H.uellm_cap(g) == 150  # max_length = the longest label + 50, the padded prompt inside it
    assert H.steps(g, 1.0, H.uellm_cap(g)) == 100 and H.steps(g, 4.0, H.uellm_cap(g)) == 100
    assert H.steps(g, 4.0, H.MAX_LENGTH) == 400 and H.steps(g, "cap", H.MAX_LENGTH) == 2048 - 50
    hz = results["uellm"]["harness"]
    by = {(r["factor"], r["system"]): r for r in hz["rows"]}
    for f in H.FACTORS:  # UELLM's cap binds its rows; S³'s only at 2,048: S³ never shortens as rows grow
        assert by[(f, "S3")]["elapsed_s"] >= by[(1.0, "S3")]["elapsed_s"] - 1e-9
        assert by[(f, "Morphling")]["elapsed_s"] > by[(f, "Morphling-noprof")]["elapsed_s"]
    assert hz["requests"] == 100  # ar = 100


def test_morphling_keeps_the_fastest_trial_and_counts_every_trial(bench):
    from tools.bench.papers import uellm_cluster as U

    devs = U.gpus()
    lengths = np.array([[20, 100], [40, 200]])
    choice = U.morphling("llama2-7b", devs, lengths, lambda dep, burst, b: 100.0 / b + len(dep.stages))
    assert len(choice.trials) == 4 * len(U.MORPHLING_BATCHES) <= U.MORPHLING_BUDGET
    best = max(choice.trials, key=lambda t: t.tokens_per_s)
    assert (choice.batch, len(choice.deployment.stages)) == (best.batch, best.gpus)
    assert choice.profile_s == pytest.approx(sum(t.load_s + t.serve_s for t in choice.trials))
    wl = U.Workload((U.WorkloadRequest("a", 1.0, 5, 5), U.WorkloadRequest("b", 9.0, 5, 5)))
    assert [r.arrival_s for r in U.after_profiling(wl, 5.0).requests] == [5.0, 9.0]


def test_setups_that_cannot_fit_name_the_limit(bench):
    from llmfleet.policies.placement import PlacementInfeasible
    from llmfleet.sim.spec import ClusterSpec, SimSpec
    from llmfleet.workload import Workload, WorkloadRequest

    from tools.bench.papers import common as C
    from tools.bench.papers import seallm_setup as S
    from tools.bench.papers import uellm_cluster as U

    small = SimSpec(ClusterSpec.parse("4xA100-80GB"), S.spec().services)
    wl = Workload(
        tuple(WorkloadRequest(f"r{i}", 0.1 * i, 100, 50, s.name) for i, s in enumerate(small.services))
    )
    with pytest.raises(PlacementInfeasible, match=r"llama2-70b.*1 of 4 GPUs.*needs tp=2"):
        C.simulate(small, wl, S.vllm())
    huge = Workload((WorkloadRequest("x", 0.0, 300_000, 10, "svc0"),))
    e = C.simulate(S.spec(), huge, S.vllm())
    assert "KV blocks; the pool has" in e.result.records[0].failed
    with pytest.raises(ValueError, match=r"GPU#0 .*cannot hold 80 layers of llama2-70b"):
        U.default_deployment("llama2-70b", U.gpus(), 1)
    with pytest.raises(ValueError, match="fits no configuration"):
        U.morphling("llama2-70b", U.gpus()[:2], np.array([[5, 5]]), lambda d, w, b: 1.0)
    with pytest.raises(ValueError, match="gives no service any traffic"):
        S.workload({"svc0": ("opt-6.7b", np.array([[5, 5]]))}, {"svc0": 0.0}, 10.0, 10.0, seed=0)


def test_scls_run_length_study(bench, monkeypatch):
    sc = bench.scenario("scls")
    monkeypatch.setattr(sc, "settings", lambda q, t: {"rates": (4.0,), "duration_s": 8.0, "lengths": (4.0,)})
    res = sc.run(tiny=True, log=lambda _m: None)
    (e,) = res["run_length"]
    assert e["horizon_s"] == 4.0 and e["requests"] > 0 and e["ratio"] == e["scls_tput"] / e["sls_tput"]
    assert res["notes"][0].startswith("Run length at 4 req/s") and "at the sweep's 8 s" in res["notes"][0]


def test_seallm_prefill_demand_scales_with_rate_and_prompt(bench):
    from tools.bench.papers import seallm_factors as F

    short = {"a": ("llama2-7b", np.array([[100, 10]] * 4)), "b": ("llama2-70b", np.array([[100, 10]] * 4))}
    long = {k: (m, a * np.array([20, 1])) for k, (m, a) in short.items()}
    share = {"a": 0.5, "b": 0.5}
    one = F.prefill_gpus(short, share, 1.0)
    assert one > 0 and F.prefill_gpus(short, share, 4.0) == pytest.approx(4 * one)
    assert F.prefill_gpus(long, share, 1.0) > 10 * one  # prefill work grows with the prompt
    assert F.prefill_gpus(short, {"a": 1.0, "b": 0.0}, 1.0) < F.prefill_gpus(short, {"a": 0.0, "b": 1.0}, 1.0)


def test_mell_row_comes_from_the_migration_bench(results):
    res = results["mell"]
    variants = [r["variant"] for r in res["rows"]]
    assert variants and set(variants) == {"BF", "WF", "LB", "Mell"}
    for r in res["rows"]:
        assert r["failed"] == 0 and r["completed"] == r["requests"] > 0, r
        assert 0 < r["peak_active"] <= 40 and 0.0 <= r["mem_util"] <= 1.0
        assert r["steady_kv_util"] is not None and 0.0 < r["steady_kv_util"] <= 1.0
        assert 0.0 < r["steady_mem_util"] <= r["weights_ceiling"] + 1e-9 < 1.0
        assert (r["openings"].get("opened_arrival", 0) > 0) == r["variant"].startswith("Mell")
    g = res["goal"]
    assert g["met"] == (g["util"]["met"] and g["savings"]["met"])
    assert "KV in use / C" in g["ours_text"] and "4/3 × fluid bound + 3" in g["ours_text"]
    assert res["savings"] and {"peak_vs_WF", "mean_vs_LB", "steady_vs_WF"} <= set(res["savings"][0])
    assert res["openings"] and all(o["opened"] >= o["with_room"] for o in res["openings"])


def test_mell_units_combine_to_the_in_process_run(bench, results):
    sc = bench.scenario("mell")
    parts = sc.parts(tiny=True)
    assert len(parts) == len(results["mell"]["rows"]) and len({k for k, _, _ in parts}) == len(parts)
    rows = {k: sc.run_part(job) for k, _, job in reversed(parts)}  # any order
    res = sc.combine(rows, tiny=True, log=lambda _m: None)
    strip = ("sim_wall_s", "wall_s")
    assert [{k: v for k, v in r.items() if k not in strip} for r in res["rows"]] == [
        {k: v for k, v in r.items() if k not in strip} for r in results["mell"]["rows"]
    ]
    assert res["goal"]["ours_text"] == results["mell"]["goal"]["ours_text"]


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


def test_resume_takes_the_journal_units_and_runs_the_rest(bench, tmp_path):
    """A run that ended early (its journal cut mid-line) resumed with --resume: the journal's units
    are not run again, the rest are, and the numbers equal a run from scratch."""
    args = ["--tiny", "--only", "mell", "--no-plots", "--processes", "1"]
    assert bench.main([*args, "--out", str(tmp_path / "whole")]) == 0
    lines = (tmp_path / "whole" / "units.jsonl").read_text().splitlines()
    assert len(lines) >= 3
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "units.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    logged: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("builtins.print", lambda *a, **k: logged.append(" ".join(map(str, a))))
        assert bench.main([*args, "--resume", "--out", str(cut)]) == 0
    assert any(f"2 of {len(lines)} units taken from the journal" in m for m in logged)
    journal = [json.loads(x) for x in (cut / "units.jsonl").read_text().splitlines()]
    assert [j["key"] for j in journal] == [json.loads(x)["key"] for x in lines]  # the two kept, the rest ran

    def numbers(path: Path):  # every simulated figure (the wall and CPU times of this machine aside)
        def strip(x):
            if isinstance(x, dict):
                return {k: strip(v) for k, v in x.items() if "wall" not in k and k not in ("unit_s", "cpu_s")}
            return [strip(v) for v in x] if isinstance(x, list) else x

        return strip(json.loads((path / "papers.json").read_text())["papers"]["mell"])

    assert numbers(tmp_path / "whole") == numbers(cut)


def test_seallm_setup_assignments_share_plan_and_load(bench):
    from tools.bench.papers import seallm_setup as S

    perms = {S.assigned_models(a) for a in S.ASSIGNMENTS}
    assert len(perms) >= 3 and all(sorted(p) == sorted(S.MODELS) for p in perms)  # random, all four
    assert S.assigned_models(2) == S.assigned_models(2) and S.assigned_models(None) == S.MODELS  # seeded
    sp = S.spec(1)
    plan = S.vllm_share_plan(sp)
    assert sorted(p.models[0] for p in plan) == sorted(S.MODELS) and {p.tp for p in plan} == {8}
    pools = {
        "svc0": ("llama2-7b", np.array([[100, 300]] * 8)),
        "svc1": ("llama2-70b", np.array([[100, 300]] * 8)),
    }
    share = {"svc0": 0.5, "svc1": 0.5}
    small = S.spec(None)
    one = S.offered_load(small, pools, share, 1.0)
    assert 0 < one < S.offered_load(small, pools, share, 2.0) == pytest.approx(2 * one)
    long = {k: (m, a * np.array([10, 1])) for k, (m, a) in pools.items()}
    assert S.offered_load(small, long, share, 1.0) > one  # longer prompts: more work
    short = S.short_lengths("sharegpt")
    mean_in = np.mean([r.prompt_tokens for r in short.requests])
    assert 40 < mean_in < 110  # Table 1's 73 tokens, log-normal, capped
    with pytest.raises(ValueError, match="lengths must be"):
        S.short_lengths("alpaca")


def test_seallm_units_combine_to_the_in_process_run(bench, results):
    """Algorithm 1's search is a unit; each system on its plan takes the search's result."""
    sc = bench.scenario("seallm")
    parts = sc.parts(tiny=True)
    on_plan = ["seallm", "seallm-f", "seallm-literal", "seallm-prefill_first"]
    keys = [
        "sharegpt/a0/4/free", "sharegpt/a0/4/search", *(f"sharegpt/a0/4/{n}" for n in on_plan),
        "conv/a0/4/free", "conv/a0/4/search", "conv/a0/4/seallm", "conv/a0/4/seallm-f",
    ]  # fmt: skip
    assert [p[0] for p in parts] == keys and all(p[1] > 0 for p in parts)
    after = {k: a for k, _, _, a in parts}
    assert after["sharegpt/a0/4/seallm-f"] == ("sharegpt/a0/4/search",) and after["conv/a0/4/free"] == ()
    out = {k: sc.run_part(job) for k, _, job, a in reversed(parts) if not a}  # any order
    out |= {k: sc.run_part(job, {x: out[x] for x in a}) for k, _, job, a in reversed(parts) if a}
    res = sc.combine(out, tiny=True, log=lambda _m: None)
    strip = ("sim_wall_s", "wall_s")
    assert [{k: v for k, v in r.items() if k not in strip} for r in res["rows"]] == [
        {k: v for k, v in r.items() if k not in strip} for r in results["seallm"]["rows"]
    ]
    assert res["goal"]["ours_text"] == results["seallm"]["goal"]["ours_text"]


def _timeless(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("sim_wall_s", "wall_s")} for r in rows]


def test_scls_units_combine_to_the_in_process_run(bench, monkeypatch):
    sc = bench.scenario("scls")
    monkeypatch.setattr(
        sc, "settings", lambda q, t: {"rates": (4.0, 6.0), "duration_s": 8.0, "lengths": (4.0,)}
    )
    whole = sc.run(tiny=True, log=lambda _m: None)
    parts = sc.parts(tiny=True)
    assert len(parts) == 2 * len(sc.SWEEP) + len(sc.LENGTH_POLICIES) and all(w > 0 for _, w, _ in parts)
    out = {k: sc.run_part(job) for k, _, job in reversed(parts)}  # any order
    res = sc.combine(out, tiny=True, log=lambda _m: None)
    assert _timeless(res["rows"]) == _timeless(whole["rows"]) and res["run_length"] == whole["run_length"]
    assert res["goal"] == whole["goal"] and res["notes"] == whole["notes"]


def test_aladdin_units_combine_to_the_in_process_run(bench, results):
    sc = bench.scenario("aladdin")
    parts = sc.parts(tiny=True)
    assert [k.split("/")[0] for k, _, _ in parts][:2] == ["sweep", "headline"] and all(
        w > 0 for _, w, _ in parts
    )
    out = {k: sc.run_part(job, log=lambda _m: None) for k, _, job in reversed(parts)}  # any order
    res = sc.combine(out, tiny=True, log=lambda _m: None)
    whole = results["aladdin"]
    assert _timeless(res["rows"]) == _timeless(whole["rows"]) and res["headline"] == whole["headline"]
    assert res["goal"] == whole["goal"] and res["workers"] == whole["workers"]


def test_units_split_papers_with_parts_and_run_heaviest_first(bench):
    work = bench.units(["uellm", "mell"], quick=False, tiny=True)
    assert [u.weight for u in work] == sorted((u.weight for u in work), reverse=True)
    whole = [u for u in work if u.key is None]
    assert [u.paper for u in whole] == ["uellm"] and whole[0].weight == bench.PAPER_SECONDS["uellm"]
    mell = [u for u in work if u.paper == "mell"]
    assert len(mell) == len(bench.scenario("mell").parts(tiny=True)) and all(u.key for u in mell)


def test_a_unit_waits_for_the_parts_it_takes_and_the_longest_chain_goes_first(bench):
    U = bench.Unit
    search, on_plan, big = U("p", "search", 5.0), U("p", "sys", 4.0, after=("search",)), U("p", "big", 8.0)
    rank = bench.chains([big, on_plan, search])
    assert rank == {search: 9.0, on_plan: 4.0, big: 8.0}  # the search first: 9 s of work hang on it
    with pytest.raises(ValueError, match="not run"):
        bench.chains([on_plan])
    work = [u for u in bench.units(["seallm"], quick=False, tiny=True) if u.key.startswith("sharegpt")]
    done = bench.run_units(work, 2, quick=False, tiny=True, log=lambda _m: None)
    assert set(done) == set(work)
    plan = done[next(u for u in work if u.key.endswith("/search"))][0]["searched"]
    assert all(
        done[u][0]["plans"]["sharegpt/a0@4"]["plan"] == [f"{i}: tp{tp} {'+'.join(m)}" for i, m, tp in plan[1]]
        for u in work
        if u.after
    )


def test_aladdin_headline_checks_each_answer_on_every_seed(results):
    res = results["aladdin"]
    head = res["headline"]
    configs = [h["config"] for h in head]
    assert configs[0] == "jsq-opt" and {
        "aladdin",
        "aladdin-strict",
        "aladdin-fewest",
        "aladdin-strict-fewest",
        "aladdin hb 50 ms",
    } <= set(configs)
    for h in head:
        n = h["workers"]
        assert len(h["per_seed"]) == len(res["seeds"])
        if n is None:  # a search that found no count on some seed
            assert None in h["per_seed"] and "p100_at" not in h
            continue
        assert n >= max(h["per_seed"]) and (n == max(h["per_seed"]) or "p100_by_n" in h)
        if "p100_by_n" in h:  # a searched count: the first at which every seed holds P100 at n and n + 1
            assert h["holds"] and all(
                not (all(h["p100_by_n"][str(m)]) and all(h["p100_by_n"].get(str(m + 1), [False])))
                for m in range(min(h["per_seed"]), n)
                if str(m) in h["p100_by_n"]
            )
        assert len(h["p100_at"]) == len(h["p100_above"]) == len(res["seeds"]) and len(
            h["busy_workers"]
        ) == len(res["seeds"])
        assert len(h["p100_below"]) == (0 if n == 1 else len(res["seeds"])) and h["gpus"] == n * h["tp"]
        assert h["holds"] == (all(h["p100_at"]) and all(h["p100_above"]))
        assert all(0 < b <= n + 1 for b in h["busy_workers"])
    assert {w for w in res["workers"]["llama2-7b"]} >= {"n_eq6", "n_paper_memory", "n_roofline", "paper_n"}
    g = res["goal"]
    assert g["met"] is False or all(h["holds"] for h in res["summary"]["headline"])


def test_aladdin_split_units_combine_to_the_in_process_run(bench, monkeypatch):
    """The split-phase decode arm is one unit per model; its rows, run apart, combine to the in-process
    run's (and the default arm's pieces are left out when it runs alone)."""
    from tools.bench.papers.aladdin_split import SPLIT

    sc = bench.scenario("aladdin")
    tiny = sc.settings(False, True)
    model = {"llama2-7b": {**tiny["models"]["llama2-7b"], "rates": (20.0,)}}
    cfg = {**tiny, "models": model, "sweep": False, "default_arm": False}
    monkeypatch.setattr(sc, "settings", lambda q, t: cfg)
    whole = sc.run(tiny=True, log=lambda _m: None)
    parts = sc.parts(tiny=True)
    assert [k for k, _, _ in parts] == ["split/llama2-7b/tp1"] and all(w > 0 for _, w, _ in parts)
    out = {k: sc.run_part(job, log=lambda _m: None) for k, _, job in parts}
    res = sc.combine(out, tiny=True, log=lambda _m: None)
    assert [h["config"] for h in whole["split"]] == [c[0] for c in SPLIT] and not whole["headline"]
    assert res["split"] == whole["split"] and res["summary"]["split"] == whole["summary"]["split"]
    assert res["split_text"] == whole["split_text"] and whole["split_text"].startswith("split-phase decode")
    for h in whole["split"]:
        assert h["arm"] == "split-phase decode" and len(h["per_seed"]) == len(cfg["seeds"])
        assert all(0 < d <= n for d, n in zip(h["decode_requests"], h["requests"], strict=True))
        if h["workers"] is not None:
            assert h["holds"] == (all(h["p100_at"]) and all(h["p100_above"]))


def test_low_load_spread_gives_the_least_hosted_model_every_third_pair() -> None:
    """``seallm_low_load.spread``: one change to Algorithm 1's plan, in every third group of its most
    replicated pair the pair's first model is replaced by the least hosted model (the 70B aside)."""
    from llmfleet.policies.placement import InstancePlan

    from tools.bench.papers.seallm_low_load import spread

    pair = ("llama2-13b", "llama2-7b")
    plan = [InstancePlan(f"g{i}", pair, 1) for i in range(6)]
    plan += [InstancePlan("o", ("llama2-13b", "opt-6.7b"), 1), InstancePlan("big", ("llama2-70b",), 2)]
    out, change = spread(plan)
    assert [p.models for p in out[:6]] == [pair, pair, ("llama2-7b", "opt-6.7b")] * 2
    assert out[6:] == plan[6:] and [p.instance_id for p in out] == [p.instance_id for p in plan]
    assert change == "llama2-13b+llama2-7b ×6: every third hosts opt-6.7b instead"


def test_a_p100_search_that_stops_at_the_first_miss_answers_as_full_runs(bench):
    """Aladdin's headline asks only whether P100 holds at most counts: a run cut at its first miss gives
    the same answer, and the counts that held keep their full run's numbers."""
    from llmfleet.costmodel import hardware
    from llmfleet.workload import Workload, WorkloadRequest

    from tools.bench.papers.aladdin_sweep import Search

    wl = Workload(
        tuple(WorkloadRequest(f"r{i}", 0.05 * i, 700 + 53 * (i % 9), 30 + 11 * (i % 6), "chat", "llama2-7b")
              for i in range(240))
    )  # fmt: skip
    args = ("llama2-7b", 1, "jsq", wl, (0.4, 0.015), None, None, hardware("a100-80gb"))
    full, cut = Search(*args), Search(*args, stop_at_miss=True)
    counts = (1, 2, 4, 8)  # P100 fails below 8 workers here
    answers = [full.eval(n)["p100"] for n in counts]
    assert [cut.p100(n) for n in counts] == answers and False in answers and True in answers
    assert cut.missed == {n for n, ok in zip(counts, answers, strict=True) if not ok}
    assert cut.p100_by_n() == dict(zip(counts, answers, strict=True))
    for n in set(counts) - cut.missed:
        assert cut.seen[n] == full.seen[n]
    assert cut.ok(1, "p100") is False and cut.eval(1) == full.seen[1]  # a full run where one is asked for
    other = Search(*args, stop_at_miss=True)  # the same config on the same workload takes a run as is
    other.adopt(full, 8)
    assert other.seen == {8: full.seen[8]}
    with pytest.raises(ValueError, match="same config"):
        Search("llama2-7b", 1, "round_robin", *args[3:]).adopt(full, 8)
