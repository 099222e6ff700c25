"""UELLM (HELR deployment + SLO-ODBS batching) against S³ and a Morphling-like deployer, on UELLM's
heterogeneous, power-capped 4-GPU cluster: latency, throughput and SLO violations vs rate.

Setup (paper §5.1–5.2 → ours; the cluster and deployers are in ``uellm_cluster``, quoted there):

- Cluster: 4 RTX 3090 capped at 350/300/250/150 W (Table 2) → ``costmodel.pipeline.RTX_3090`` with the
  cap as a speed factor; a deployment is a ``device_map`` (layers over an ordered GPU subset, stage after
  stage), simulated as one instance.
- Model: ChatGLM2-6B, the catalog's ``chatglm2-6b`` (28 layers, hidden 4096, multi-query attention with 2
  KV groups of 128: 28 KB of KV a token, fp16).
- Requests: Alpaca (the predictor's training set) → the 4,000-item Alpaca sample's (prompt, output)
  lengths (approximate token counts), Poisson arrivals for ``duration`` s. The paper gives no rates; ours
  are fixed before any run at 1–6 req/s for the whole cluster (the previous round's 1–6 req/s per GPU).
- SLOs: "from 1 to 350 s, completely random" → 8 deadline classes 1, 50, …, 350 s (services
  ``slo1``…``slo350``), one drawn uniformly per request; violation = not finished within its deadline.
- Length prediction: UELLM's fine-tuned ChatGLM3-6B classifier (99.5 % bucket precision on Alpaca) → a
  **noisy oracle**: the true output length × exp(N(0, 0.3²)), clearly not a real predictor.
- Engine: HF-style static batches (padded, rows returned at batch end).
- Systems (Fig. 5): ``UA`` (HELR + SLO-ODBS), ``UB`` (default deployment + SLO-ODBS), ``UD`` (HELR + FIFO
  batches of 10, UELLM's default batching), ``S3`` (default deployment + S³: FCFS batches sized by the
  predicted-KV reservation), ``Morphling`` (stress-tested configuration, FIFO batches of its size,
  profiling time counted) and ``Morphling-noprof`` (the same run without the profiling wait). Batching on
  the HELR deployment (Fig. 4): ``slo_dbs``, ``odbs``, ``slo_odbs-authors`` (the scripts' constants),
  ``fifo-cm`` (FIFO with SLO-ODBS's own CM-based, memory-sized batches) and ``s3-helr``.
- One factor at a time, at the top rate: the same systems on four uncapped GPUs (``uniform``).

Two readings of the headline, side by side:

- **like for like** (the sweep above): every system serves the same Poisson arrivals, each request
  generating its own output length whatever the system;
- **the authors' harness** (``uellm_harness``): 100 requests at once, total elapsed time, UELLM's
  batches cut at their longest label + 50 tokens and S³'s at ``max_length`` 2,048 with sampling, as the
  public scripts run them; rows generate ``factor × label`` tokens for factors 1, 2, 4 and the cap.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from llmfleet.policies.batching import POLICIES as STATIC_BATCHERS
from llmfleet.policies.placement import InstancePlan
from llmfleet.sim.run import PolicyBundle
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.types import Slo
from llmfleet.workload import Workload, alpaca_lengths

from . import common as C
from . import uellm_cluster as U
from . import uellm_harness as H

NAME = "uellm"
TITLE = "UELLM — HELR + SLO-ODBS vs S³ and Morphling on 4 power-capped 24 GB GPUs (latency, SLO violations)"
MODEL = "chatglm2-6b"
DEADLINES = (1, 50, 100, 150, 200, 250, 300, 350)
SIGMA = 0.3
SYSTEMS = ("UA", "UB", "UD", "S3", "Morphling", "Morphling-noprof")
BATCHING = ("slo_dbs", "odbs", "slo_odbs-authors", "fifo-cm", "s3-helr")
CLAIM = (
    "UELLM vs S³ and Morphling: latency −72.3% to −90.3%, throughput 1.92–4.98×, SLO violations −29.6% to "
    "−48.2% (4 power-capped RTX 3090, ChatGLM2-6B); SLO-ODBS keeps ODBS's low latency and SLO-DBS's low "
    "violation rate vs FIFO (Fig. 4, no numbers given)."
)


def settings(quick: bool, tiny: bool) -> dict:
    if tiny:
        return {"rates": (1.0,), "duration_s": 10.0, "uniform": False}
    if quick:
        return {"rates": (2.0, 6.0), "duration_s": 60.0, "uniform": True}
    return {"rates": (1.0, 2.0, 4.0, 6.0), "duration_s": 180.0, "uniform": True}


def _bundle(name: str, local: str, **opts) -> PolicyBundle:
    """The engine policy ``local`` with ``opts``; a static batcher as the paper ran it (recompute at a
    slice end, on the static stepper)."""
    if local in STATIC_BATCHERS:
        opts = {"slice_end": "recompute", **opts}
    return PolicyBundle(name, dispatch="round_robin", engine={"policy": local, "options": opts})


BATCHERS = {
    "slo_odbs": ("slo_odbs", {}),
    "slo_odbs-authors": ("slo_odbs", {"preset": "authors"}),
    "slo_dbs": ("slo_dbs", {}),
    "odbs": ("odbs", {}),
    "fifo": ("static_sls", {"batch_size": 10}),
    "fifo-cm": ("fifo_cm", {}),
    "s3": ("s3", {}),
}


def _spec(services, dep: U.Deployment) -> SimSpec:
    return SimSpec(ClusterSpec(1, dep.hw), services, EngineSettings(static_release="batch_end"))


def _services() -> tuple[SimService, ...]:
    return tuple(SimService(f"slo{d}", MODEL, Slo(deadline_s=float(d)), max_tokens=1024) for d in DEADLINES)


def _sim(services, dep, wl, preds: dict[str, float], name: str, batcher: tuple[str, dict]):
    local, opts = batcher
    plan = [InstancePlan("dep0", (MODEL,), 1)]
    values = [preds[r.request_id] for r in wl.requests]
    return C.simulate(
        _spec(services, dep), wl, _bundle(name, local, **opts), plan=plan,
        predict=C.SequencePredictor(wl, values), samples=40,
    )  # fmt: skip


def _row_metrics(e, original: Workload | None = None) -> dict:
    """C.metrics, with latencies counted from the original arrivals when ``original`` is given (the
    requests that waited for Morphling's profiling)."""
    m = C.metrics(e)
    if original is not None:
        arr = {r.request_id: r.arrival_s for r in original.requests}
        recs = [r for r in e.result.records if r.done]
        lat = np.array([r.finish_s - arr[r.request_id] for r in recs])
        ok = [r.finish_s - arr[r.request_id] <= float(r.service[3:]) for r in recs]
        m["latency_mean_s"] = float(lat.mean()) if len(lat) else 0.0
        m["latency_p95_s"] = float(np.percentile(lat, 95)) if len(lat) else 0.0
        m["latency_p99_s"] = float(np.percentile(lat, 99)) if len(lat) else 0.0
        m["slo_uellm"] = sum(ok) / max(1, len(e.result.records))
        span = max((r.finish_s for r in recs), default=0.0)
        toks = sum(r.output_tokens for r in recs)
        m["throughput_tokens_per_s"] = toks / span if span > 0 else 0.0
        m["throughput_rps"] = len(recs) / span if span > 0 else 0.0
    m["slo_violation"] = None if m["slo_uellm"] is None else 1 - m["slo_uellm"]
    return m


def _morphling_serve(services):
    def serve(dep: U.Deployment, burst: Workload, batch: int) -> float:
        svc = (SimService("stress", MODEL, Slo(deadline_s=1e9), max_tokens=1024),)
        e = C.simulate(
            _spec(svc, dep), burst, _bundle("trial", "static_sls", batch_size=batch),
            plan=[InstancePlan("dep0", (MODEL,), 1)], samples=2,
        )  # fmt: skip
        return float(e.report["cluster"]["makespan_s"])

    return serve


def _cluster(caps, lengths, services) -> dict:
    devs = U.gpus(caps)
    return {
        "default": U.default_deployment(MODEL, devs),
        "helr": U.helr_deployment(MODEL, devs),
        "morphling": U.morphling(MODEL, devs, lengths, _morphling_serve(services), seed=5),
    }


def _run_systems(deps, services, wl, preds, names, rate, tag) -> list[dict]:
    mor = deps["morphling"]
    runs = {
        "UA": ("helr", "slo_odbs"), "UB": ("default", "slo_odbs"), "UD": ("helr", "fifo"),
        "S3": ("default", "s3"), "slo_dbs": ("helr", "slo_dbs"), "odbs": ("helr", "odbs"),
        "slo_odbs-authors": ("helr", "slo_odbs-authors"), "fifo-cm": ("helr", "fifo-cm"),
        "s3-helr": ("helr", "s3"),
    }  # fmt: skip
    rows = []
    for name in names:
        if name.startswith("Morphling"):
            dep, batcher = mor.deployment, ("static_sls", {"batch_size": mor.batch})
            delayed = name == "Morphling"
            run_wl = U.after_profiling(wl, mor.profile_s) if delayed else wl
            e = _sim(services, dep, run_wl, preds, name, batcher)
            m = _row_metrics(e, wl if delayed else None)
        else:
            key, batcher = runs[name]
            dep = deps[key]
            e = _sim(services, dep, wl, preds, name, BATCHERS[batcher])
            m = _row_metrics(e)
        rows.append({"rate_rps": rate, "policy": name, "deployment": dep.label, "cluster": tag,
                     "workload": "Alpaca, Poisson", **m})  # fmt: skip
    return rows


def run(quick: bool = False, log: C.Log = print, tiny: bool = False) -> dict:
    t0 = time.perf_counter()
    cfg = settings(quick, tiny)
    lengths = np.array(alpaca_lengths(C.ALPACA), dtype=np.int64)
    services = _services()
    deps = _cluster(U.CAPS_W, lengths, services)
    mor = deps["morphling"]
    log(f"  uellm deployments: default {deps['default'].label}, HELR {deps['helr'].label}, Morphling "
        f"{mor.deployment.label} batch {mor.batch} after {len(mor.trials)} trials ({mor.profile_s:.0f} s)")  # fmt: skip
    rows, uniform, oracle = [], [], []
    for i, rate in enumerate(cfg["rates"]):
        wl = C.poisson_workload(
            lengths, rate, cfg["duration_s"], seed=300 + i, service=[s.name for s in services], model=MODEL
        )
        preds = dict(
            zip((r.request_id for r in wl.requests), C.noisy_oracle(wl, SIGMA, seed=400 + i), strict=True)
        )
        for r in _run_systems(deps, services, wl, preds, SYSTEMS + BATCHING, rate, "capped"):
            rows.append(r)
            log(f"  uellm {rate:g} req/s ({len(wl)} req) {r['policy']:16s} {r['deployment']:28s} lat "
                f"{r['latency_mean_s']:.1f}s viol {r['slo_violation']:.3f} tok/s {r['throughput_tokens_per_s']:.0f}")  # fmt: skip
        if cfg["uniform"] and rate == cfg["rates"][-1]:
            udeps = _cluster((U.RTX_3090_TDP_W,) * len(U.CAPS_W), lengths, services)
            uniform = _run_systems(udeps, services, wl, preds, SYSTEMS, rate, "uniform 350 W")
            uniform_deps = {
                k: (v.deployment.label if k == "morphling" else v.label) for k, v in udeps.items()
            }
            for r in uniform:
                log(
                    f"  uellm uniform {rate:g} req/s {r['policy']:16s} {r['deployment']:28s} lat {r['latency_mean_s']:.1f}s"
                )
            exact = {r.request_id: float(r.output_tokens) for r in wl.requests}  # one factor: the predictor
            oracle = _run_systems(deps, services, wl, exact, ("UA", "S3"), rate, "capped, exact lengths")
    harness = H.run(deps, MODEL, lengths, DEADLINES, seed=500)
    for r in harness["rows"]:
        log(f"  uellm harness ×{r['factor']} {r['system']:13s} elapsed {r['elapsed_s']:.1f}s mean latency "
            f"{r['latency_mean_s']:.1f}s cut {100 * r['cut_elapsed']:.0f}% (elapsed)")  # fmt: skip
    result = {
        "paper": NAME,
        "title": TITLE,
        "setup": {
            "cluster": "4 × RTX 3090 (24 GB) capped at 350/300/250/150 W → speed ×1, 0.86, 0.71, 0.43 (FLOP/s and "
            f"bandwidth); {MODEL}; one device_map = one simulated instance",
            "deployments": f"default (S3, UB): device_map=auto over all 4 = {deps['default'].label}; HELR (UA, UD): "
            f"{deps['helr'].label}; Morphling: {mor.deployment.label}, batch {mor.batch} (best of "
            f"{len(mor.trials)} stress tests, {mor.profile_s:.0f} s of profiling before serving)",
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
        "uniform": uniform,
        "uniform_deployments": uniform_deps if uniform else {},
        "morphling_trials": [t.__dict__ for t in mor.trials],
        "harness": harness,
        "exact_oracle": oracle,
        "wall_s": 0.0,
    }
    _summarize(result)
    result["wall_s"] = time.perf_counter() - t0
    return result


def _at(rows, rate, policy):
    return next(r for r in rows if r["rate_rps"] == rate and r["policy"] == policy)


def _cut(a: dict, b: dict, key: str = "latency_mean_s") -> float | None:
    r = C.ratio(a[key], b[key])
    return None if r is None else 1 - r


def _summarize(res: dict) -> None:
    rows = res["rows"]
    rates = sorted({r["rate_rps"] for r in rows})
    per = []
    for rate in rates:
        ua = _at(rows, rate, "UA")
        e = {"rate_rps": rate}
        for b in ("S3", "Morphling", "Morphling-noprof", "UB", "UD", "fifo-cm"):
            x = _at(rows, rate, b)
            e[f"lat_cut_vs_{b}"] = _cut(ua, x)
            e[f"viol_cut_vs_{b}"] = (
                None if not x["slo_violation"] else 1 - ua["slo_violation"] / x["slo_violation"]
            )
            e[f"tput_over_{b}"] = C.ratio(ua["throughput_tokens_per_s"], x["throughput_tokens_per_s"])
        per.append(e)
    top = per[-1]
    both = [min(p["lat_cut_vs_S3"] or -9, p["lat_cut_vs_Morphling"] or -9) for p in per]
    best_i = int(np.argmax(both))
    res["summary"] = {"per_rate": per, "best_rate": per[best_i]["rate_rps"], "best_min_cut": both[best_i]}
    res["claim"] = CLAIM
    b = per[best_i]
    hz = res["harness"]
    cuts = {  # on the total elapsed time the scripts print; mean latency beside, in the table
        f: min(
            r["cut_elapsed"] for r in hz["rows"] if r["factor"] == f and r["system"] in ("S3", "Morphling")
        )
        for f in H.FACTORS
    }
    res["summary"]["harness_cuts"] = {str(f): c for f, c in cuts.items()}
    like = (
        f"like for like: at {b['rate_rps']:g} req/s {C.fmt(100 * (b['lat_cut_vs_S3'] or 0), '.0f')}% vs S³, "
        f"{C.fmt(100 * (b['lat_cut_vs_Morphling'] or 0), '.0f')}% vs Morphling "
        f"({C.fmt(100 * (b['lat_cut_vs_Morphling-noprof'] or 0), '.0f')}% without its profiling wait); at "
        f"{rates[-1]:g} req/s {C.fmt(100 * (top['lat_cut_vs_S3'] or 0), '.0f')}% / "
        f"{C.fmt(100 * (top['lat_cut_vs_Morphling'] or 0), '.0f')}%"
    )
    even = hz["break_even_factor"]
    res["goal"] = {
        "text": "UA (HELR + SLO-ODBS) ≥ 70% lower latency than S³ and than the Morphling-like baseline under the "
        "authors' harness (total elapsed time of 100 requests, as the scripts print it; paper: 72.3–90.3%), the "
        "like-for-like mean latency beside it",
        "target": 0.7,
        "ours": cuts[1.0],
        "ours_text": "authors' harness (100 requests at once, elapsed time), the smaller cut vs S³ and Morphling "
        "with rows generating "
        + ", ".join(
            f"{'the cap' if f == 'cap' else f'{f:g}× the label'} {100 * c:.0f}%" for f, c in cuts.items()
        )
        + f"; ≥ 70% from {'–' if even is None else f'{even:g}×'} the label; {like}",
        "met": cuts[1.0] >= 0.7,
        "like_for_like": both[best_i],
    }
    ua, s3, mo = (_at(rows, rates[-1], p) for p in ("UA", "S3", "Morphling"))
    res["ours"] = (
        f"at {rates[-1]:g} req/s UA: mean latency {C.fmt(ua['latency_mean_s'])} s vs S³ {C.fmt(s3['latency_mean_s'])} s "
        f"and Morphling {C.fmt(mo['latency_mean_s'])} s; throughput {C.fmt(ua['throughput_tokens_per_s'], '.0f')} vs "
        f"{C.fmt(s3['throughput_tokens_per_s'], '.0f')} and {C.fmt(mo['throughput_tokens_per_s'], '.0f')} tok/s; SLO "
        f"violations {C.fmt(100 * ua['slo_violation'], '.1f')}% vs {C.fmt(100 * s3['slo_violation'], '.1f')}% and "
        f"{C.fmt(100 * mo['slo_violation'], '.1f')}%."
    )
    notes = [
        "Deployment: the 13.5 GB model fits one 24 GB GPU, so HELR puts every layer on the fastest GPU (fewest "
        "devices and lowest latency at once); the default device_map spreads the layers over all four, each "
        "step crossing the slow GPUs one after the other, but with four GPUs' memory for KV (bigger batches).",
        "Morphling's wait: its stress tests run before serving; requests that arrive meanwhile wait, which is "
        "how the paper explains UD's lower latency than Morphling (§5.3). The Morphling-noprof row is the same "
        "deployment without that wait.",
    ]
    if res.get("uniform"):
        u = {r["policy"]: r for r in res["uniform"]}
        notes.append(
            f"One factor: the same systems at {rates[-1]:g} req/s on four uncapped GPUs — UA "
            f"{C.fmt(u['UA']['latency_mean_s'])} s, S³ {C.fmt(u['S3']['latency_mean_s'])} s, Morphling "
            f"{C.fmt(u['Morphling']['latency_mean_s'])} s (no wait {C.fmt(u['Morphling-noprof']['latency_mean_s'])} s), "
            f"UB {C.fmt(u['UB']['latency_mean_s'])} s; deployments {res['uniform_deployments']}."
        )
    notes.append(
        "The authors' harness against like for like: the public scripts stop UELLM's batches at their longest "
        "label + 50 tokens and leave S³ at chat_batch's max_length 2,048 with sampling, so how long S³'s rows run "
        "is ChatGLM2's sampled length, not the label. The goal reads 'met' only at rows of their label length, the "
        "one reading that assumes nothing about sampling; S3-uellm-cap (S³ with UELLM's cap) isolates the cap: "
        + ", ".join(
            f"×{r['factor']}: S³ {C.fmt(r['latency_mean_s'])} s"
            + f" / S3-uellm-cap {C.fmt(next(x['latency_mean_s'] for x in hz['rows'] if x['factor'] == r['factor'] and x['system'] == 'S3-uellm-cap'))} s"
            for r in hz["rows"]
            if r["system"] == "S3"
        )
        + f" (UA's batches {hz['groups']['UA']}, S³'s {hz['groups']['S3']}, Morphling's {hz['groups']['Morphling']})."
    )
    if res.get("exact_oracle"):
        ex = {r["policy"]: r for r in res["exact_oracle"]}
        ua6, s36 = (_at(rows, rates[-1], p) for p in ("UA", "S3"))
        notes.append(
            f"One factor, the length predictor: at {rates[-1]:g} req/s with exact output lengths instead of the noisy "
            f"oracle (σ = {SIGMA}), UA {C.fmt(ex['UA']['latency_mean_s'])} s (noisy: {C.fmt(ua6['latency_mean_s'])} s), "
            f"S³ {C.fmt(ex['S3']['latency_mean_s'])} s (noisy: {C.fmt(s36['latency_mean_s'])} s)."
        )
    no = hz["no_overhead"]
    notes.append(
        "One factor, the pipeline overheads (harness, elapsed time, without them / with them): "
        + ", ".join(
            f"×{f} {name} {C.fmt(no[str(f)][name])} s / "
            f"{C.fmt(next(r['elapsed_s'] for r in hz['rows'] if r['factor'] == f and r['system'] == name))} s"
            for f in (1.0, "cap")
            for name in ("UA", "S3")
        )
        + "."
    )
    notes.append(
        "Differences that remain: a noisy oracle for the fine-tuned length classifier, the power cap as a linear "
        "speed factor, the pipeline overheads of costmodel.pipeline (per iteration "
        f"{1000 * hz['overhead']['per_iteration_s']:g} ms, per stage boundary "
        f"{1000 * hz['overhead']['per_stage_s']:g} ms) assumed, not measured, and charged in the harness only "
        "(the sweep's simulator uses its cost source as is), and no measured RTX 3090 times."
    )
    res["notes"] = notes


COLUMNS = (
    ("req/s", "rate_rps", ".0f"),
    ("system", "policy", ""),
    ("deployment", "deployment", ""),
    ("mean latency s", "latency_mean_s", ".2f"),
    ("p99 latency s", "latency_p99_s", ".1f"),
    ("tok/s", "throughput_tokens_per_s", ".0f"),
    ("SLO violations", "slo_violation", ".3f"),
    ("done", "completed", ""),
)


def markdown(res: dict) -> str:
    extra = ["UA against each baseline per rate (cut = 1 − UA/theirs):", ""]
    extra.append(
        C.md_table(
            res["summary"]["per_rate"],
            [
                ("req/s", "rate_rps", ".0f"),
                ("latency cut vs S³", "lat_cut_vs_S3", ".0%"),
                ("vs Morphling", "lat_cut_vs_Morphling", ".0%"),
                ("vs Morphling (no wait)", "lat_cut_vs_Morphling-noprof", ".0%"),
                ("vs UB", "lat_cut_vs_UB", ".0%"),
                ("vs UD", "lat_cut_vs_UD", ".0%"),
                ("vs FIFO-CM", "lat_cut_vs_fifo-cm", ".0%"),
                ("violation cut vs S³", "viol_cut_vs_S3", ".0%"),
                ("tok/s vs S³", "tput_over_S3", ".2f"),
            ],
        )
    )
    if res.get("uniform"):
        extra += ["", "One factor: four uncapped GPUs, top rate:", "", C.md_table(res["uniform"], COLUMNS)]
    extra += [
        "",
        "The authors' harness (100 requests at once; rows generate factor × label tokens within their batch's "
        "cap; cut = 1 − UA / theirs, on mean latency and on the total elapsed time the scripts print):",
        "",
        C.md_table(
            res["harness"]["rows"],
            [
                ("factor", "factor", ""),
                ("system", "system", ""),
                ("elapsed s", "elapsed_s", ".1f"),
                ("mean latency s", "latency_mean_s", ".1f"),
                ("SLO violations", "slo_violation", ".2f"),
                ("batches", "batches", ""),
                ("UA's cut (latency)", "cut_latency", ".0%"),
                ("UA's cut (elapsed)", "cut_elapsed", ".0%"),
            ],
        ),
    ]
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
