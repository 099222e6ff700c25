"""UELLM (SLO-ODBS static batching): latency, throughput and SLO (deadline) violations vs rate.

Setup (paper §5.1 → ours):

- Cluster: 4 RTX 3090 (24 GB, power-capped to differ) serving ChatGLM2-6B → 4 × catalog ``rtx-4090``
  (24 GB; the catalog has no 3090, power caps not modelled) serving ``llama2-7b`` (ChatGLM2-6B is not in
  the model catalog; 6.2B vs 6.7B parameters, both MHA fp16), one TP-1 instance per GPU, round robin.
- Requests: Alpaca (the profiler's training set) → (prompt, output) lengths of the 4,000-item Alpaca
  sample (approximate token counts), Poisson arrivals for ``duration`` s.
- SLOs: "from 1 to 350 s, completely random" → 8 deadline classes 1, 50, 100, …, 350 s (services
  ``slo1``…``slo350``), one drawn uniformly per request; violation = not finished within its deadline.
- Length prediction: UELLM's fine-tuned ChatGLM3-6B classifier (reported 99.5% bucket precision on
  Alpaca) → a **noisy oracle**: the true output length × exp(N(0, 0.3²)), clearly not a real predictor.
- Engine: HF-style static batches (padded, rows returned at batch end).
- Policies: ``slo_odbs`` (the authors' defaults: threshold 15000, L2 = 1.2, batch cap 10; our L1 = 1/s),
  its variants ``slo_dbs`` and ``odbs``, ``slo_odbs-authors`` (the authors' script constants),
  ``slo_odbs-b64`` (the authors' constants, batch cap raised to 64), ``fifo`` (FCFS
  static batches of 10, UELLM's default batching), ``fifo-cm`` (FIFO order with SLO-ODBS's own CM-based,
  memory-sized batches: the like-for-like FIFO) and ``s3`` (S³: FCFS, batch sized by the predicted-KV
  reservation, no fixed cap).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from llmfleet.costmodel import decode_time, hardware, model_arch
from llmfleet.policies.batching import SloOdbs
from llmfleet.policies.placement import InstancePlan
from llmfleet.sim.run import PolicyBundle
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.types import Slo
from llmfleet.workload import alpaca_lengths

from . import common as C

NAME = "uellm"
TITLE = "UELLM — SLO-ODBS static batching on 4 × 24 GB GPUs (latency, throughput, SLO violations)"
MODEL = "llama2-7b"
HW = "rtx-4090"
GPUS = 4
DEADLINES = (1, 50, 100, 150, 200, 250, 300, 350)
SIGMA = 0.3
CLAIM = (
    "SLO-ODBS keeps ODBS's low latency and SLO-DBS's low violation rate vs FIFO batching (Fig. 4, no numbers "
    "given); UELLM vs S³ and Morphling: latency −72.3% to −90.3%, throughput 1.92–4.98×, SLO violations "
    "−29.6% to −48.2%."
)


def settings(quick: bool, tiny: bool) -> dict:
    if tiny:
        return {"rates": (4.0,), "duration_s": 10.0}
    if quick:
        return {"rates": (6.0, 16.0), "duration_s": 60.0}
    return {"rates": (4.0, 8.0, 12.0, 16.0, 24.0), "duration_s": 180.0}


def policies() -> list[PolicyBundle]:
    return [
        PolicyBundle("slo_odbs", dispatch="round_robin", local="slo_odbs",
                     description="SLO-ODBS, the paper's terms calibrated to its SLO range (preset paper)"),
        PolicyBundle("slo_odbs-authors", dispatch="round_robin", local="slo_odbs",
                     local_options={"preset": "authors"},
                     description="SLO-ODBS with the authors' script constants (threshold 15000, batch 10)"),
        PolicyBundle("slo_dbs", dispatch="round_robin", local="slo_dbs", description="SLO term only"),
        PolicyBundle("odbs", dispatch="round_robin", local="odbs", description="length term only"),
        PolicyBundle("slo_odbs-b64", dispatch="round_robin", local="slo_odbs",
                     local_options={"preset": "authors", "max_batch": 64},
                     description="SLO-ODBS, the authors' constants with the batch cap raised to 64"),
        PolicyBundle("fifo", dispatch="round_robin", local="static_sls", local_options={"batch_size": 10},
                     description="FIFO static batches of 10"),
        PolicyBundle("fifo-cm", dispatch="round_robin", local="fifo_cm",
                     description="FIFO static batches sized by SLO-ODBS's CM rule (same memory-sized batches)"),
        PolicyBundle("s3", dispatch="round_robin", local="s3", description="S³: FCFS, predicted-KV reservation"),
    ]  # fmt: skip


def run(quick: bool = False, log: C.Log = print, tiny: bool = False) -> dict:
    t0 = time.perf_counter()
    cfg = settings(quick, tiny)
    lengths = np.array(alpaca_lengths(C.ALPACA), dtype=np.int64)
    services = tuple(
        SimService(f"slo{d}", MODEL, Slo(deadline_s=float(d)), max_tokens=1024) for d in DEADLINES
    )
    spec = SimSpec(ClusterSpec.parse(f"{GPUS}x{HW}"), services, EngineSettings(static_release="batch_end"))
    plan = [InstancePlan(f"gpu{i}", (MODEL,), 1) for i in range(GPUS)]
    rows = []
    for i, rate in enumerate(cfg["rates"]):
        wl = C.poisson_workload(
            lengths, rate, cfg["duration_s"], seed=300 + i, service=[s.name for s in services], model=MODEL
        )
        preds = C.noisy_oracle(wl, SIGMA, seed=400 + i)
        for bundle in policies():
            e = C.simulate(spec, wl, bundle, plan=plan, predict=C.SequencePredictor(wl, preds), samples=40)
            m = C.metrics(e)
            m["slo_violation"] = None if m["slo_uellm"] is None else 1 - m["slo_uellm"]
            tight = e.report["services"].get(f"slo{DEADLINES[0]}", {}).get("slo", {}).get("uellm")
            m["violation_tightest_class"] = None if tight is None else 1 - tight
            rows.append({"rate_rps": rate, "policy": bundle.name, "workload": "Alpaca, Poisson", **m})
            log(
                f"  uellm {rate:g} req/s ({len(wl)} req) {bundle.name:12s} lat {m['latency_mean_s']:.1f}s "
                f"tok/s {m['throughput_tokens_per_s']:.0f} viol {m['slo_violation']:.3f} [{m['sim_wall_s']:.1f}s]"
            )
    result = {
        "paper": NAME,
        "title": TITLE,
        "setup": {
            "cluster": f"{GPUS} × catalog {HW} (24 GB, stand-in for RTX 3090), {MODEL} (stand-in for ChatGLM2-6B), "
            "TP 1 each, round robin",
            "workload": f"Poisson {', '.join(f'{r:g}' for r in cfg['rates'])} req/s for {cfg['duration_s']:g} s; "
            f"Alpaca lengths (approximate token counts; mean in/out {lengths[:, 0].mean():.0f}/{lengths[:, 1].mean():.0f})",
            "deadlines": f"uniform over {', '.join(map(str, DEADLINES))} s per request",
            "prediction": f"noisy oracle: true output × exp(N(0, {SIGMA}²)) — a stand-in for UELLM's fine-tuned "
            "classifier, NOT a real predictor",
            "engine": "static batches, padded, rows returned at batch end (HF)",
            "cost model": C.cost_label(),
        },
        "workload": "Alpaca lengths, Poisson",
        "cost_source": C.COST_SOURCE,
        "rows": rows,
        "mean_output_tokens": float(lengths[:, 1].mean()),
        "max_output_tokens": int(lengths[:, 1].max()),
        "wall_s": 0.0,
    }
    _summarize(result)
    result["wall_s"] = time.perf_counter() - t0
    return result


def _at(rows, rate, policy):
    return next(r for r in rows if r["rate_rps"] == rate and r["policy"] == policy)


def _summarize(res: dict) -> None:
    rows = res["rows"]
    rates = sorted({r["rate_rps"] for r in rows})
    per = []
    for rate in rates:
        s, s64, f, s3 = (_at(rows, rate, p) for p in ("slo_odbs", "slo_odbs-b64", "fifo", "s3"))
        per.append(
            {
                "rate_rps": rate,
                "lat_cut_vs_fifo": 1 - C.ratio(s["latency_mean_s"], f["latency_mean_s"]),
                "lat_cut_vs_s3": 1 - C.ratio(s["latency_mean_s"], s3["latency_mean_s"]),
                "tput_over_fifo": C.ratio(s["throughput_tokens_per_s"], f["throughput_tokens_per_s"]),
                "viol_cut_vs_fifo": None
                if not f["slo_violation"]
                else 1 - s["slo_violation"] / f["slo_violation"],
                "b64_lat_cut_vs_fifo": 1 - C.ratio(s64["latency_mean_s"], f["latency_mean_s"]),
                "lat_cut_vs_fifo_cm": 1
                - C.ratio(s["latency_mean_s"], _at(rows, rate, "fifo-cm")["latency_mean_s"]),
                "b64_lat_cut_vs_s3": 1 - C.ratio(s64["latency_mean_s"], s3["latency_mean_s"]),
            }
        )
    top = per[-1]
    best = max(p["lat_cut_vs_fifo"] for p in per)
    same = all(
        _at(rows, r, "slo_odbs")["latency_mean_s"] == _at(rows, r, v)["latency_mean_s"]
        for r in rates
        for v in ("slo_dbs", "odbs")
    )
    res["summary"] = {"per_rate": per, "best_lat_cut_vs_fifo": best, "variants_identical": same}
    res["claim"] = CLAIM
    res["goal"] = {
        "text": "≥ 70% lower mean latency than S³ (paper: UELLM, i.e. HELR + SLO-ODBS, vs S³ and Morphling on a "
        "heterogeneous power-capped cluster; here SLO-ODBS vs S³ on identical GPUs: the heterogeneous cluster, "
        "HELR there and the Morphling-like baseline are not built)",
        "target": 0.7,
        "ours": top["lat_cut_vs_s3"],
        "ours_text": f"{C.fmt(100 * top['lat_cut_vs_s3'], '.0f')}% vs S³ at {rates[-1]:g} req/s (best "
        f"{C.fmt(100 * max(p['lat_cut_vs_s3'] for p in per), '.0f')}%); vs FIFO with the same CM-sized batches "
        f"{C.fmt(100 * top['lat_cut_vs_fifo_cm'], '.0f')}%; vs FIFO batches of 10 {C.fmt(100 * top['lat_cut_vs_fifo'], '.0f')}% "
        f"(best {C.fmt(100 * best, '.0f')}%)",
        "met": top["lat_cut_vs_s3"] >= 0.7,
    }
    s, f, s3 = (_at(rows, rates[-1], p) for p in ("slo_odbs", "fifo", "s3"))
    res["ours"] = (
        f"at {rates[-1]:g} req/s SLO-ODBS: mean latency {C.fmt(s['latency_mean_s'])} s vs FIFO "
        f"{C.fmt(f['latency_mean_s'])} s and S³ {C.fmt(s3['latency_mean_s'])} s; throughput "
        f"{C.fmt(s['throughput_tokens_per_s'], '.0f')} vs {C.fmt(f['throughput_tokens_per_s'], '.0f')} and "
        f"{C.fmt(s3['throughput_tokens_per_s'], '.0f')} tok/s; SLO violations {C.fmt(100 * s['slo_violation'], '.1f')}% vs "
        f"{C.fmt(100 * f['slo_violation'], '.1f')}% and {C.fmt(100 * s3['slo_violation'], '.1f')}% "
        f"({C.fmt(100 * (top['viol_cut_vs_fifo'] or 0), '.0f')}% fewer violations than FIFO). With the batch cap "
        f"raised to 64 SLO-ODBS is {C.fmt(100 * top['b64_lat_cut_vs_fifo'], '.0f')}% below FIFO's latency, "
        f"{C.fmt(1 - top['b64_lat_cut_vs_s3'], '.2f')}× S³'s."
    )
    low = [r for r in rows if r["rate_rps"] == rates[0]]
    lo_min = min(r["slo_violation"] for r in low)
    lo_max = max(r["slo_violation"] for r in low)
    lo_tight = float(np.mean([r["violation_tightest_class"] or 0.0 for r in low]))
    mean_out = res["mean_output_tokens"]
    step = decode_time(model_arch(MODEL), hardware(HW), 1, mean_out)
    pol = SloOdbs(preset="authors")  # the note below is about the authors' constants (slo_odbs-authors)
    # the effective cap: the policy's max_batch (None = none) within the engine's per-batch request limit
    engine_cap = EngineSettings().max_batch_requests
    cap = engine_cap if pol.max_batch is None else min(pol.max_batch, engine_cap)
    worst = pol.join_cost(DEADLINES[-1], res["max_output_tokens"], DEADLINES[-1], 0.0, cap - 1)
    closes = "never reaches" if worst <= pol.threshold else "can reach"
    notes = [
        f"With the authors' defaults (threshold {pol.threshold:.0f}, L1 = {pol.L1:g}/s, L2 = {pol.L2:g}/token, "
        f"cap {cap}) the join cost {closes} the threshold on this workload: its largest possible value, "
        f"a {DEADLINES[-1]} s request with the longest Alpaca output ({res['max_output_tokens']} tokens) joining "
        f"{cap - 1} others, is {worst:.0f}. Every batch then closes at the cap of {cap}, so "
        f"SLO-ODBS is earliest-deadline-first batches of {cap}: the same batch sizes as FIFO, a "
        "different order. EDF lowers violations; it cannot cut mean latency without more throughput."
        + (" SLO-DBS and ODBS give identical results for the same reason." if same else ""),
        "`slo_odbs` runs the paper's terms calibrated to its SLO range (L1, L2 such that each term is half "
        "the threshold at a typical join of the 10th member; see `llmfleet.policies.batching.slo_odbs`), with "
        "the batch sized by memory (CM-based) rather than a fixed cap; `slo_odbs-authors` keeps the scripts' "
        "constants.",
        "Raising the cap to 64 (`slo_odbs-b64`) shows where UELLM's gains can come from under static batching: "
        "larger batches (throughput) and splitting off requests whose predicted output is much longer (rows "
        "no longer wait for one long row). S³ gets the same batch-size gain from its predicted-KV reservation.",
        f"The {DEADLINES[0]} s deadline class (1/{len(DEADLINES)} of requests) is mostly out of reach for a "
        f"static batch that must prefill and decode ~{mean_out:.0f} tokens at ≥ {1e3 * step:.0f} ms per step: at "
        f"{rates[0]:g} req/s {C.fmt(100 * lo_tight, '.0f')}% of that class is violated and the overall "
        f"violation rate is {C.fmt(100 * lo_min, '.1f')}"
        + ("" if lo_max - lo_min < 5e-4 else f"–{C.fmt(100 * lo_max, '.1f')}")
        + "% for every policy.",
        "UELLM's headline latency numbers also include its HELR deployment on heterogeneous, power-capped "
        "GPUs (vs Morphling/S³); the simulator models identical GPUs and one instance per GPU, so only the "
        "batching part is reproduced.",
    ]
    res["notes"] = notes


COLUMNS = (
    ("req/s", "rate_rps", ".0f"),
    ("policy", "policy", ""),
    ("workload", "workload", ""),
    ("cost", "cost_source", ""),
    ("mean latency s", "latency_mean_s", ".2f"),
    ("p99 latency s", "latency_p99_s", ".1f"),
    ("tok/s", "throughput_tokens_per_s", ".0f"),
    ("req/s done", "throughput_rps", ".2f"),
    ("SLO violations", "slo_violation", ".3f"),
    ("done", "completed", ""),
)


def markdown(res: dict) -> str:
    extra = ["SLO-ODBS vs the baselines per rate (cut = 1 − ours/theirs):", ""]
    extra.append(
        C.md_table(
            res["summary"]["per_rate"],
            [
                ("req/s", "rate_rps", ".0f"),
                ("latency cut vs FIFO", "lat_cut_vs_fifo", ".0%"),
                ("latency cut vs S³", "lat_cut_vs_s3", ".0%"),
                ("tok/s vs FIFO", "tput_over_fifo", ".2f"),
                ("violation cut vs FIFO", "viol_cut_vs_fifo", ".0%"),
                ("b64: latency cut vs FIFO", "b64_lat_cut_vs_fifo", ".0%"),
                ("b64: latency cut vs S³", "b64_lat_cut_vs_s3", ".0%"),
            ],
        )
    )
    return C.section(res, C.md_table(res["rows"], COLUMNS), extra)


def plot(res: dict, out: Path) -> list[Path]:
    return [
        C.plot_sweep(
            res["rows"],
            [
                ("latency_mean_s", "mean latency (s)", True),
                ("throughput_tokens_per_s", "throughput (tokens/s)", False),
                ("slo_violation", "SLO violation rate", False),
            ],
            out / "uellm_sweep.png",
            TITLE,
        )
    ]
