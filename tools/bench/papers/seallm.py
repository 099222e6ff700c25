"""SeaLLM (service-aware sharing of several LLMs): normalized latency, p99 latency and SLO attainment.

The setup is ``seallm_setup`` (paper §6.1 quoted there, shared with ``placement_bench.py``): 32 A100-80GB,
OPT-6.7B and Llama2-7B/13B/70B on k-means clusters of conv-trace ∪ LongBench-like lengths, per-service
rates from function popularity dealt round-robin (MAF counts with ``--popularity PATH``, else a Zipf law
matched to MAF's published tail), each service its own bursty Gamma process, 2–50 req/s, 300 s of
arrivals per rate.

Metrics (paper §6.1 "Metrics"): normalized latency (latency ÷ the service's mean execution time), the
99th-percentile latency, SLO attainment with SLO = 5 × the request's execution time (``sim.metrics``).
We also give p99 of the normalized latency, and the drain (completion of the last request − end of the
arrivals): a drain that grows with the run means the queue never settles, and then every ratio grows
with the run length, which ``run_length`` measures at one rate.

Policies: ``vllm`` (``vllm-v0.4``: even split, FCFS one phase per iteration, fewest requests — the
paper's vLLM), ``alpaserve`` (``alpaserve-v0.4``: all models on every instance, unified KV, FCFS — "we
implement AlpaServe with our unified KV cache and FCFS"), ``muxserve`` (colocated, round-robin prefill),
``seallm`` (Algorithm 1, ≤ 2 services per engine, searched once per rate on a separate 60 s history of
the same processes with the preset's own engines, then fixed: the paper's SeaLLM-A, doubling budget,
fewest requests), ``seallm-colocated`` (DB on all-models-everywhere: the scheduling effect alone, beside
AlpaServe), and, at ``adaptive_rates`` only, ``seallm-adaptive`` (the ``seallm-placement`` preset:
Algorithm 1 re-run during the run on the last interval's arrivals, adaptive interval Eq. 8, β = 0.1).
The adaptive preset re-searches every ~50 s (~100 simulations of the window each), about 30 min of CPU
per 300 s run at 30 req/s on this machine, which is why the sweep uses the fixed plan.
"""

from __future__ import annotations

import time
from pathlib import Path

from llmfleet.sim.run import preset

from . import common as C
from . import seallm_setup as S

NAME = "seallm"
TITLE = "SeaLLM — sharing 4 LLMs on 32 A100-80GB (normalized latency, p99, SLO attainment)"
POLICIES = ("vllm", "alpaserve", "muxserve", "seallm-colocated", "seallm")
POPULARITY: Path | None = None  # set by run.py --popularity: MAF function counts instead of the Zipf law
LENGTH_RATE = 30.0  # req/s of the run-length study (fixed before any run)
ADAPTIVE_RATES = (5.0, 20.0)  # where the adaptive preset also runs (CPU budget, see the module doc)
CLAIM = (
    "normalized latency up to 10.38× lower than vLLM (9.52× AlpaServe, 13.60× MuxServe), p99 up to "
    "12.13×/5.80×/18.69× lower, SLO attainment up to 1.82×/3.64×/2.11× higher; SeaLLM's normalized "
    "latency < 3 and SLO attainment > 90% at every rate (2–50 req/s, 32 A800)."
)


def settings(quick: bool, tiny: bool) -> dict:
    if tiny:
        return {"rates": (4.0,), "horizon_s": 4.0, "lengths": (), "length_rate": 4.0, "adaptive_rates": (),
                "history_s": 4.0}  # fmt: skip
    if quick:
        return {"rates": (10.0, 30.0), "horizon_s": 60.0, "lengths": (30.0, 60.0), "length_rate": 30.0,
                "adaptive_rates": (), "history_s": 30.0}  # fmt: skip
    return {"rates": S.RATES, "horizon_s": S.HORIZON_S, "lengths": (60.0, 120.0, 300.0, 600.0),
            "length_rate": LENGTH_RATE, "adaptive_rates": ADAPTIVE_RATES, "history_s": S.HISTORY_S}  # fmt: skip


def _systems() -> dict:
    b, factory = S.seallm()
    return {
        "vllm": (S.vllm(), None),
        "alpaserve": (preset("alpaserve-v0.4"), None),
        "muxserve": (preset("muxserve"), None),
        "seallm-colocated": (preset("seallm"), None),
        "seallm": (S.seallm_fixed(), None),
        "seallm-adaptive": (b, factory),
    }


def _run_one(sp, wl, bundle, factory, horizon: float, plan=None) -> dict:
    e = C.simulate(sp, wl, bundle, samples=40, evaluator_factory=factory, plan=plan)
    m = C.metrics(e)
    m["drain_s"] = max(0.0, m["makespan_s"] - horizon)
    plans = e.report.get("placement") or []
    m["replans"] = sum(1 for p in plans if p.get("status") == "applied")
    m["last_plan"] = plans[-1]["plan"] if plans else ""
    return m


def run(quick: bool = False, log: C.Log = print, tiny: bool = False) -> dict:
    t0 = time.perf_counter()
    cfg = settings(quick, tiny)
    sp = S.spec()
    pools = S.length_pools(C.conv_trace(), sp)
    pop = S.popularity(POPULARITY)
    share = S.shares(pop)
    systems = _systems()
    rows, adaptive, plans = [], [], {}

    def plan_at(rate: float, i: int):
        if rate not in plans:
            history = S.workload(pools, share, rate, cfg["history_s"], seed=500 + i)
            t1 = time.perf_counter()
            plans[rate] = S.place(sp, history)
            log(f"  seallm Algorithm 1 at {rate:g} req/s [{time.perf_counter() - t1:.0f}s]: {plans[rate][1]}")
        return plans[rate][0]

    for i, rate in enumerate(cfg["rates"]):
        wl = S.workload(pools, share, rate, cfg["horizon_s"], seed=100 + i)
        names = POLICIES + (("seallm-adaptive",) if rate in cfg["adaptive_rates"] else ())
        for name in names:
            bundle, factory = systems[name]
            t1 = time.perf_counter()
            plan = plan_at(rate, i) if name == "seallm" else None
            m = _run_one(sp, wl, bundle, factory, cfg["horizon_s"], plan)
            row = {"rate_rps": rate, "policy": name, "horizon_s": cfg["horizon_s"], **m}
            (adaptive if name == "seallm-adaptive" else rows).append(row)
            log(
                f"  seallm {rate:g} req/s ({len(wl)} req) {name:16s} norm {m['norm_latency_mean']:.2f} "
                f"p99 {m['latency_p99_s']:.1f}s slo {m['slo_seallm']:.3f} drain {m['drain_s']:.0f}s "
                f"[{time.perf_counter() - t1:.0f}s]"
            )
    lengths = []
    for h in cfg["lengths"]:
        wl = S.workload(pools, share, cfg["length_rate"], h, seed=999)
        entry = {"horizon_s": h, "rate_rps": cfg["length_rate"], "requests": len(wl)}
        for name in ("vllm", "seallm"):
            bundle, factory = systems[name]
            plan = plan_at(cfg["length_rate"], 99) if name == "seallm" else None
            m = _run_one(sp, wl, bundle, factory, h, plan)
            entry.update({f"{name}_{k}": m[k] for k in ("norm_latency_mean", "latency_p99_s", "drain_s")})
        entry["norm_ratio"] = C.ratio(entry["vllm_norm_latency_mean"], entry["seallm_norm_latency_mean"])
        entry["p99_ratio"] = C.ratio(entry["vllm_latency_p99_s"], entry["seallm_latency_p99_s"])
        lengths.append(entry)
        log(f"  seallm run length {h:g}s at {cfg['length_rate']:g} req/s: ×{C.fmt(entry['norm_ratio'])} mean, "
            f"×{C.fmt(entry['p99_ratio'])} p99")  # fmt: skip
    services = [
        {
            "service": s.name,
            "model": s.model,
            "share": share[s.name],
            "mean_prompt": float(pools[s.name][1][:, 0].mean()),
            "mean_output": float(pools[s.name][1][:, 1].mean()),
        }
        for s in sp.services
    ]
    tag = f"conv∪LongBench-like k-means×4, {pop.source} round-robin, Gamma CV {S.ARRIVAL_CV:g}"
    result = {
        "paper": NAME,
        "title": TITLE,
        "setup": {
            "cluster": f"{S.CLUSTER} (8 per node)",
            "services": ", ".join(
                f"{s['service']}→{s['model']} ({s['share']:.1%} of the rate, mean in/out "
                f"{s['mean_prompt']:.0f}/{s['mean_output']:.0f} tok)"
                for s in services
            ),
            "workload": f"per-service shares from {pop.source} dealt round-robin (MAF's functions → services); "
            f"each service its own Gamma process (CV {S.ARRIVAL_CV:g}); {cfg['horizon_s']:g} s of arrivals per rate",
            "SLO": "5 × the request's solo execution time on its instance",
            "engines": "vllm/alpaserve: FCFS one phase per iteration (vLLM 0.2–0.4); seallm: Algorithm 1 "
            "(≤ 2 services per engine) + Eq. 8 adaptive re-placement (β = 0.1), doubling budget",
            "cost model": C.cost_label(),
        },
        "workload": tag,
        "cost_source": C.COST_SOURCE,
        "services": services,
        "rows": rows,
        "adaptive": adaptive,
        "plans": {
            str(r): {"plan": [f"{p.instance_id}: tp{p.tp} {'+'.join(p.models)}" for p in pl], "reason": why}
            for r, (pl, why) in plans.items()
        },
        "run_length": lengths,
        "wall_s": 0.0,
    }
    _summarize(result)
    result["wall_s"] = time.perf_counter() - t0
    return result


def _at(rows: list[dict], rate: float, policy: str) -> dict:
    return next(r for r in rows if r["rate_rps"] == rate and r["policy"] == policy)


def _summarize(res: dict) -> None:
    rows = res["rows"]
    rates = sorted({r["rate_rps"] for r in rows})
    per_rate = []
    for rate in rates:
        s = _at(rows, rate, "seallm")
        entry = {
            "rate_rps": rate,
            "seallm_drain_s": s["drain_s"],
            "vllm_drain_s": _at(rows, rate, "vllm")["drain_s"],
            "seallm_failed": s["failed"],
            "vllm_failed": _at(rows, rate, "vllm")["failed"],
            "requests": s["requests"],
        }
        for b in ("vllm", "alpaserve", "muxserve"):
            x = _at(rows, rate, b)
            entry[f"norm_{b}_over_seallm"] = C.ratio(x["norm_latency_mean"], s["norm_latency_mean"])
            entry[f"normp99_{b}_over_seallm"] = C.ratio(x["norm_latency_p99"], s["norm_latency_p99"])
            entry[f"p99_{b}_over_seallm"] = C.ratio(x["latency_p99_s"], s["latency_p99_s"])
            entry[f"slo_seallm_over_{b}"] = C.ratio(s["slo_seallm"], x["slo_seallm"])
        per_rate.append(entry)
    keys = [k for k in per_rate[0] if k.endswith("_over_seallm") or k.startswith("slo_seallm_over")]
    up_to = {k: max((e[k] for e in per_rate if e[k] is not None), default=None) for k in keys}
    best = max(per_rate, key=lambda e: e["norm_vllm_over_seallm"] or 0.0)
    ours = best["norm_vllm_over_seallm"]
    res["summary"] = {"per_rate": per_rate, "up_to": up_to}
    res["goal"] = {
        "text": "≥ 10× lower mean normalized latency than vllm-v0.4 somewhere in 2–50 req/s (paper 10.38×; p99 12.13×)",
        "target": 10.0,
        "ours": ours,
        "ours_text": f"{C.fmt(ours)}× at {best['rate_rps']:g} req/s (p99 latency ×{C.fmt(up_to['p99_vllm_over_seallm'])} "
        f"best over the sweep)",
        "met": ours is not None and ours >= 10.0,
    }
    # normalized latency counts completed requests only: say where SeaLLM fails some and vLLM does not
    failing = [e for e in per_rate if e["seallm_failed"] > e["vllm_failed"]]
    same = [e for e in per_rate if e["seallm_failed"] == 0 and e["vllm_failed"] == 0]
    if failing:
        best_same = max(same, key=lambda e: e["norm_vllm_over_seallm"] or 0.0) if same else None
        res["goal"]["ours_text"] += (
            "; but SeaLLM fails "
            + ", ".join(f"{e['seallm_failed']}/{e['requests']}" for e in failing)
            + " requests at "
            + ", ".join(f"{e['rate_rps']:g}" for e in failing)
            + " req/s, left out of its figures"
            + (
                f" (on the same requests: {C.fmt(best_same['norm_vllm_over_seallm'])}× at "
                f"{best_same['rate_rps']:g} req/s)"
                if best_same
                else ""
            )
        )
        res["goal"]["like_for_like"] = best_same and best_same["norm_vllm_over_seallm"]
    res["claim"] = CLAIM
    res["ours"] = (
        f"best ratios over the sweep: mean normalized latency {C.fmt(up_to['norm_vllm_over_seallm'])}× / "
        f"{C.fmt(up_to['norm_alpaserve_over_seallm'])}× / {C.fmt(up_to['norm_muxserve_over_seallm'])}× "
        f"(vLLM/AlpaServe/MuxServe), p99 latency {C.fmt(up_to['p99_vllm_over_seallm'])}× / "
        f"{C.fmt(up_to['p99_alpaserve_over_seallm'])}× / {C.fmt(up_to['p99_muxserve_over_seallm'])}×, SLO "
        f"attainment {C.fmt(up_to['slo_seallm_over_vllm'])}× / {C.fmt(up_to['slo_seallm_over_alpaserve'])}× / "
        f"{C.fmt(up_to['slo_seallm_over_muxserve'])}× (values < 1: SeaLLM is worse)."
    )
    notes = []
    if failing:
        notes.append(
            "SeaLLM's plan fails requests vLLM completes ("
            + ", ".join(
                f"{e['seallm_failed']} of {e['requests']} at {e['rate_rps']:g} req/s" for e in failing
            )
            + "). Normalized latency, p99 and drain count completed requests only, so the ratios at those rates "
            "are not like-for-like; `seallm_failures.py` breaks the failures down by service."
        )
    over = [e["rate_rps"] for e in per_rate if e["vllm_drain_s"] > 0.1 * max(r["horizon_s"] for r in rows)]
    if over:
        notes.append(
            f"vLLM's queue does not settle from {min(over):g} req/s (its last request finishes > 10% of the run "
            "after the arrivals end): there the ratio measures a growing queue, and grows with the run length "
            "(see the run-length table)."
        )
    lens = res.get("run_length") or []
    if lens:
        notes.append(
            "Run length at "
            + f"{lens[0]['rate_rps']:g} req/s: "
            + ", ".join(f"{e['horizon_s']:g} s → ×{C.fmt(e['norm_ratio'])}" for e in lens)
            + " (mean normalized latency, vLLM ÷ SeaLLM)."
        )
    notes.append(
        "Differences that remain: the conv trace stands in for ShareGPT, LongBench-like lengths are synthesized "
        "from SeaLLM's Table 1 means, MAF popularity is a Zipf law unless `--popularity` gives the counts, and "
        "latencies come from the simulator's cost model, not from A800s."
    )
    ad = res.get("adaptive") or []
    if ad:
        parts = []
        for a in ad:
            v = _at(rows, a["rate_rps"], "vllm")
            f = _at(rows, a["rate_rps"], "seallm")
            parts.append(
                f"{a['rate_rps']:g} req/s: adaptive norm {a['norm_latency_mean']:.2f} (×{C.fmt(C.ratio(v['norm_latency_mean'], a['norm_latency_mean']))} "
                f"vs vLLM; {a['replans']} re-placements) vs fixed plan {f['norm_latency_mean']:.2f}"
            )
        notes.append(
            "Adaptive re-placement (`seallm-placement` preset, Eq. 8) beside the fixed plan: "
            + "; ".join(parts)
            + "."
        )
    res["notes"] = notes


COLUMNS = (
    ("req/s", "rate_rps", ".0f"),
    ("policy", "policy", ""),
    ("norm. latency", "norm_latency_mean", ".2f"),
    ("norm. p99", "norm_latency_p99", ".1f"),
    ("p99 latency s", "latency_p99_s", ".1f"),
    ("SLO attain. (5×)", "slo_seallm", ".3f"),
    ("TTFT s", "ttft_mean_s", ".2f"),
    ("TPOT ms", "tpot_mean_ms", ".1f"),
    ("drain s", "drain_s", ".0f"),
    ("done", "completed", ""),
)


def markdown(res: dict) -> str:
    extra = ["Ratios per rate (baseline ÷ SeaLLM for latencies, SeaLLM ÷ baseline for SLO):", ""]
    extra.append(
        C.md_table(
            res["summary"]["per_rate"],
            [
                ("req/s", "rate_rps", ".0f"),
                ("norm vLLM/S", "norm_vllm_over_seallm", ".2f"),
                ("norm p99 vLLM/S", "normp99_vllm_over_seallm", ".2f"),
                ("p99 vLLM/S", "p99_vllm_over_seallm", ".2f"),
                ("norm Alpa/S", "norm_alpaserve_over_seallm", ".2f"),
                ("norm Mux/S", "norm_muxserve_over_seallm", ".2f"),
                ("SLO S/vLLM", "slo_seallm_over_vllm", ".2f"),
                ("vLLM drain s", "vllm_drain_s", ".0f"),
                ("SeaLLM drain s", "seallm_drain_s", ".0f"),
            ],
        )
    )
    if res.get("run_length"):
        extra += ["", "Run length (same processes, longer arrivals):", ""]
        extra.append(
            C.md_table(
                res["run_length"],
                [
                    ("arrivals s", "horizon_s", ".0f"),
                    ("req/s", "rate_rps", ".0f"),
                    ("vLLM norm", "vllm_norm_latency_mean", ".2f"),
                    ("SeaLLM norm", "seallm_norm_latency_mean", ".2f"),
                    ("norm ratio", "norm_ratio", ".2f"),
                    ("p99 ratio", "p99_ratio", ".2f"),
                    ("vLLM drain s", "vllm_drain_s", ".0f"),
                ],
            )
        )
    return C.section(res, C.md_table(res["rows"], COLUMNS), extra)


def plot(res: dict, out: Path) -> list[Path]:
    return [
        C.plot_sweep(
            res["rows"],
            [
                ("norm_latency_mean", "normalized latency (mean)", True),
                ("latency_p99_s", "p99 latency (s)", True),
                ("slo_seallm", "SLO attainment (5× exec)", False),
            ],
            out / "seallm_sweep.png",
            TITLE,
        )
    ]
