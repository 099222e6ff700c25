"""Mell (multi-GPU KV migration): active GPUs and KV utilization against BF, WF and LB.

The setups, policies and goals come from ``tools/bench/migration_bench.py`` (``make bench-migration``;
its docstring quotes the paper's §6 and says how each piece maps here); this module runs that bench's
``run_one`` once per simulation, each simulation one unit of run.py's pool:

- One model instance per GPU: Llama-2-7B on A100-40GB and on RTX 4090, Llama-2-13B on A100-40GB (the
  paper's models and GPUs).
- Workloads: conv-trace lengths with Poisson arrivals, the trace's own arrivals, and the long-context
  ``conv-x4`` (the paper scales its conversations to mimic long-context models).
- Policies: BF, WF, LB (the paper's baselines, counted the paper's way) and Mell (the paper's rules).
- Goals: KV in use / C ≥ 88 % over the steady window (C = "the memory capacity for the KV cache in
  each GPU"), 9–31 % fewer peak GPUs (Eq. 3) than WF and LB, and Theorem 2's bound with its additive
  constant (peak ≤ 4/3 × fluid bound + 3).

Sizes (the paper runs its prototype on 8–12 GPUs; the issue asks for runs of at least 300 s in the steady
state and at least 40 active GPUs, where Theorem 2's additive constant weighs little):

- full: the ``fleet`` load (3 × the bench's ``mid``: 30 × the trace's mean rate, × each setup's KV
  capacity relative to A100-7B) on 96 GPUs per setup, 300 s of arrivals, three setups × three workloads
  (``conv-poisson``, ``conv-trace`` and ``conv-x4``, the long-context workload: the trace's lengths × 4,
  not cut to Llama-2's context, Poisson at the same KV demand) × BF, WF, LB and Mell = 36 simulations,
  each one unit of run.py's pool. Mell+ and Mell++ (beyond the paper) are ``make bench-migration``'s.
- ``quick``: A100-7B only, ``conv-poisson`` and ``conv-x4``, 120 s, WF, LB and Mell.
- ``tiny``: one 10 s run per policy on A100-7B at the ``mid`` load.

Utilization is averaged over the steady window (``migration_bench_setup.steady_window``: the arrival
window without its first quarter; the drain after the last arrival is left out), both readings: KV in use
/ C (the goal's) and (weights + KV in use) / GPU memory with its ceiling (a full KV pool). Mell's GPU
openings are counted by cause (``MellPacker.counters``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tools.bench import migration_bench as MB

from . import common as C

NAME = "mell"
TITLE = "Mell — KV migration, active GPUs and KV utilization vs BF / WF / LB (40 GPUs per setup)"
CLAIM = (
    "Mell reduces the number of GPUs needed by 9–31 % against the baselines and keeps GPU utilization up to "
    "43 % higher (lowest average 88 %); Theorem 2: |A(I)| ≤ 4/3·OPT(I) + c."
)
KINDS = ("conv-poisson", "conv-trace", "conv-x4")
# the paper's baselines and Mell; Mell+ and Mell++ (beyond the paper) are make bench-migration's
POLICIES = ("BF", "WF", "LB", "Mell")


def settings(quick: bool, tiny: bool) -> dict:
    if tiny:
        return {"setups": ("a100-7b",), "kinds": ("conv-poisson",), "levels": ("mid",), "horizon_s": 10.0,
                "samples": 100, "policies": POLICIES}  # fmt: skip
    if quick:
        return {"setups": ("a100-7b",), "kinds": ("conv-poisson", "conv-x4"), "levels": ("fleet",),
                "horizon_s": 120.0, "samples": 400, "policies": ("WF", "LB", "Mell")}  # fmt: skip
    return {"setups": None, "kinds": KINDS, "levels": ("fleet",), "horizon_s": 300.0, "samples": 600,
            "policies": POLICIES}  # fmt: skip


def _plain(x: Any) -> Any:
    """JSON-ready: numpy scalars to Python ones."""
    return json.loads(json.dumps(x, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _jobs(cfg: dict) -> list[tuple]:
    setups = list(cfg["setups"] or MB.SETUPS)
    return [
        (setup, kind, level, v, cfg["horizon_s"], cfg["samples"])
        for setup in setups
        for kind in cfg["kinds"]
        for level in cfg["levels"]
        for v in cfg["policies"]
    ]


# migration_bench.job_weight per expected second: A100-7B conv-poisson at the fleet load, 300 s, took
# 30 s (WF, weight 9,000) and 71 s (Mell, 18,000) on an otherwise quiet core
WEIGHT_PER_SECOND = 300.0


def parts(quick: bool = False, tiny: bool = False) -> list[tuple[str, float, tuple]]:
    """One unit per simulation for run.py's pool: (key, expected seconds, job)."""
    return [
        ("/".join(map(str, job[:4])), MB.job_weight(job) / WEIGHT_PER_SECOND, job)
        for job in _jobs(settings(quick, tiny))
    ]


def run_part(job: tuple) -> dict:
    """One simulation's row (JSON-ready, without its time series)."""
    row = MB.run_one(job, cost_source=C.COST_SOURCE)
    row.pop("_series", None)
    return _plain(row)


def run(quick: bool = False, log: C.Log = print, tiny: bool = False) -> dict:
    """Every simulation in this process, then :func:`combine`."""
    t0 = time.perf_counter()
    out = {}
    for key, _, job in parts(quick, tiny):
        out[key] = run_part(job)
        log(f"  mell {key}: {out[key]['sim_wall_s']:.0f} s")
    res = combine(out, quick=quick, tiny=tiny, log=log)
    res["wall_s"] = time.perf_counter() - t0
    return res


def combine(results: dict[str, dict], quick: bool = False, tiny: bool = False, log: C.Log = print) -> dict:
    """The paper's row from the simulations' rows (``results``: key → row, any order)."""
    cfg = settings(quick, tiny)
    order = {"/".join(map(str, job[:4])): i for i, job in enumerate(_jobs(cfg))}
    rows = [results[k] for k in sorted(results, key=lambda k: order[k])]
    mcfg = {"levels": cfg["levels"], "horizon_s": cfg["horizon_s"], "alpaca_control": False,
            "samples": cfg["samples"]}  # fmt: skip
    head = MB.headline_section(rows, mcfg)
    setups = list(cfg["setups"] or MB.SETUPS)
    lv = cfg["levels"]
    result = {
        "paper": NAME,
        "title": TITLE,
        "setup": {
            "cluster": f"{'/'.join(str(MB.cluster_gpus(x)) for x in lv)} GPUs per setup, one model instance per "
            "GPU: " + "; ".join(f"`{k}` = {MB.SETUPS[k][2]}" for k in setups),
            "workload": f"{', '.join(cfg['kinds'])} at the {'/'.join(lv)} load "
            f"({'/'.join(f'{MB.LEVELS[x]:g}' for x in lv)} × the conv trace's mean rate, × the setup's KV capacity "
            f"relative to A100-7B; conv-x4 at the same KV demand in 4× larger requests), {cfg['horizon_s']:g} s of "
            f"arrivals; prompts/outputs ≤ {MB.CONTEXT} tokens except conv-x4 (≤ the GPU's KV capacity)",
            "steady window": f"each run's arrival span without its first {MB.STEADY_SKIP:g} (ramp-up), to the last "
            "arrival (drain left out): utilization and steady-window GPUs are means over the samples there",
            "policies": "BF (best fit by free KV), WF (worst fit among active GPUs), LB (WF + Llumnix "
            "load-balancing migration), Mell (the paper's dispatch + packer, 1 s epochs, operation batching, "
            "hybrid transfer)"
            + ("; beyond the paper: Mell++ (fill_first + compact)" if "Mell++" in cfg["policies"] else ""),
            "bench": "tools/bench/migration_bench.py's run_one, one simulation per unit of run.py's pool",
            "cost model": f"{C.cost_label()}; catalog a100-40gb, rtx-4090 × llama2-7b, llama2-13b",
        },
        "workload": "conv trace (Poisson and its own arrivals), conv × 4 (long context)",
        "cost_source": C.COST_SOURCE,
        "rows": rows,
        "savings": head["savings"],
        "goals": head["goals"],
        "openings": _openings(rows),
        "settings": {**cfg, "setups": setups, "levels": list(lv)},
        "wall_s": 0.0,
    }
    _summarize(result)
    return _plain(result)


def _openings(rows: list[dict]) -> list[dict]:
    """Per Mell run: GPU openings by cause, and how many happened while another active GPU had room."""
    out = []
    for r in rows:
        o = r.get("openings") or {}
        if not o:
            continue
        causes = sorted(k.removeprefix("opened_") for k in o if k.startswith("opened_"))
        out.append({
            "setup": r["setup"], "workload": r["workload"], "variant": r["variant"],
            "opened": sum(o[f"opened_{c}"] for c in causes),
            "with_room": sum(o.get(f"room_{c}", 0) for c in causes),
            **{f"opened_{c}": o[f"opened_{c}"] for c in causes},
            **{f"room_{c}": o.get(f"room_{c}", 0) for c in causes},
        })  # fmt: skip
    return out


def _pct(x: float) -> str:
    """A percentage, to one decimal where a whole number would read as 0 or −0."""
    p = 100 * x
    return f"{p:.1f}" if p != 0 and abs(p) < 0.5 else f"{p:.0f}"


def _pct_range(rng: list[float] | None) -> str:
    return "–" if not rng else f"{_pct(rng[0])}…{_pct(rng[1])} %"


def _summarize(res: dict) -> None:
    g = res["goals"]
    util, save, theorem, fluid = g["util"], g["savings"], g["theorem"], g["fluid"]
    mell = [r for r in res["rows"] if r["variant"] == "Mell"]
    kvu = [r["steady_kv_util"] for r in mell if r["steady_kv_util"] is not None]
    r = save["ranges"]
    variants = list(dict.fromkeys(x["variant"] for x in res["rows"]))
    sums = {
        v: (
            sum(x["peak_active"] for x in res["rows"] if x["variant"] == v),
            sum(x["steady_active"] or 0.0 for x in res["rows"] if x["variant"] == v),
        )
        for v in variants
    }
    res["summary"] = {
        "runs": len(mell),
        "kv_util_min": util["min"],
        "kv_util_max": util["max"],
        "kv_util_at_88": sum(u >= 0.88 for u in kvu),
        "weights_util": [util["min_weights"], util["max_weights"]],
        "weights_ceiling": util["weights_ceiling"],
        "peak_saving": {b: r[f"peak_vs_{b}"] for b in ("BF", "WF", "LB")},
        "steady_saving": {b: r[f"steady_vs_{b}"] for b in ("BF", "WF", "LB")},
        "mean_saving": {b: r[f"mean_vs_{b}"] for b in ("BF", "WF", "LB")},
        "theorem_runs": theorem["met_runs"],
        "fluid_110_runs": fluid["met_runs"],
        "sum_peak_steady": sums,
        "plusplus": {
            k: g[f"{k}_plusplus"]["ours_text"] for k in ("util", "savings", "theorem") if f"{k}_plusplus" in g
        },
    }
    res["claim"] = CLAIM
    res["goal"] = {
        "text": "Mell: ≥ 88 % KV in use / C averaged over the steady window, and 9–31 % fewer GPUs (peak, Eq. 3) "
        "than WF and LB",
        "ours_text": f"KV in use / C (steady window) {C.fmt(util['min'], '.3f')}–{C.fmt(util['max'], '.3f')} "
        f"({sum(u >= 0.88 for u in kvu)}/{len(mell)} runs ≥ 0.88; (weights + KV) / memory "
        f"{C.fmt(util['min_weights'], '.3f')}–{C.fmt(util['max_weights'], '.3f')}, ceiling "
        f"{C.fmt(util['weights_ceiling'], '.3f')}); peak GPUs vs WF {_pct_range(r['peak_vs_WF'])}, vs LB "
        f"{_pct_range(r['peak_vs_LB'])}, vs BF {_pct_range(r['peak_vs_BF'])}; steady-window mean vs WF "
        f"{_pct_range(r['steady_vs_WF'])}, vs LB {_pct_range(r['steady_vs_LB'])}; peak ≤ 4/3 × fluid bound + "
        f"{MB.THEOREM_ADDITIVE} in {theorem['met_runs']}/{theorem['runs']} runs",
        "met": bool(util["met"] and save["met"]),
        "util": util,
        "savings": save,
        "theorem": theorem,
        "fluid": fluid,
    }
    res["ours"] = (
        f"{util['ours_text']}. {save['ours_text']}. Theorem 2's bound: {theorem['ours_text']}; within 1.10 × the "
        f"fluid bound: {fluid['ours_text']}. Σ peak / steady-window mean active GPUs: "
        + ", ".join(f"{v} {p} / {m:.1f}" for v, (p, m) in sums.items())
        + "."
    )
    res["notes"] = [
        "Unused KV room on the open GPUs over the steady window, (1 − KV/C) × mean active GPUs, per Mell run: "
        + ", ".join(
            f"{x['setup']} {x['workload']} {C.fmt((1 - x['steady_kv_util']) * x['steady_active'], '.1f')}"
            for x in mell
            if x["steady_kv_util"] is not None
        )
        + " GPUs (Theorem 2's additive constant is the open T-, S- and M-GPUs).",
        "GPU openings of Mell by cause (arrival: dispatch placed arrivals on a GPU the last plan left empty; "
        "allocate / update / depart / overload: the packer's operation that moved the first item in), and how "
        "many happened while another active GPU had room (for arrivals measured at the next epoch): "
        + "; ".join(
            f"{o['setup']} {o['workload']} {o['variant']} {o['opened']} ("
            + ", ".join(f"{k.removeprefix('opened_')} {v}" for k, v in o.items() if k.startswith("opened_"))
            + f"; {o['with_room']} with room)"
            for o in res["openings"]
        )
        + ".",
        "The fluid bound Σ⌈KV(t)/C⌉ of a run is a lower bound on any policy's peak on that run; where a "
        "baseline's peak is within 9 % of its own bound, no policy can save 9 % at the peak.",
        *(
            ["Beyond the paper: Mell++ " + "; ".join(res["summary"]["plusplus"].values()) + "."]
            if res["summary"]["plusplus"]
            else []
        ),
        *MB.NOTES,
    ]


COLUMNS = (
    ("setup", "setup", ""),
    ("workload", "workload", ""),
    ("req/s", "rate_rps", ".1f"),
    ("policy", "variant", ""),
    ("peak", "peak_active", ""),
    ("steady mean", "steady_active", ".2f"),
    ("fluid peak", "fluid_peak", ""),
    ("steady fluid", "steady_fluid", ".2f"),
    ("peak/fluid", "peak_over_fluid", ".2f"),
    ("KV / C steady", "steady_kv_util", ".3f"),
    ("KV / C whole run", "mem_util", ".3f"),
    ("(weights+KV) / mem steady", "steady_mem_util", ".3f"),
    ("ceiling", "weights_ceiling", ".3f"),
    ("mig/req", "migrations_per_req", ".2f"),
    ("p99 s", "latency_p99_s", ".1f"),
    ("failed", "failed", ""),
)


def markdown(res: dict) -> str:
    extra = [
        "Mell's GPU saving vs each baseline (1 − Mell / baseline; steady = the steady window's mean):",
        "",
    ]
    cols = [("setup", "setup", ""), ("workload", "workload", "")]
    for b in ("BF", "WF", "LB"):
        cols += [(f"peak vs {b}", f"peak_vs_{b}", ".1%"), (f"steady vs {b}", f"steady_vs_{b}", ".1%")]
    extra.append(C.md_table(res["savings"], cols))
    if res["openings"]:
        causes = sorted({k for o in res["openings"] for k in o if k.startswith("opened_")})
        ocols = [("setup", "setup", ""), ("workload", "workload", ""), ("policy", "variant", ""),
                 ("opened", "opened", ""), ("with room elsewhere", "with_room", "")]  # fmt: skip
        ocols += [(c.removeprefix("opened_"), c, "") for c in causes]
        extra += ["", "GPU openings by cause (see the notes):", "", C.md_table(res["openings"], ocols)]
    extra += ["", "Each goal of the bench, per Mell variant:", ""]
    extra += [f"- {C.goal_line(g)}" for g in res["goals"].values()]
    return C.section(res, C.md_table(res["rows"], COLUMNS), extra)


def plot(res: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    groups = list(dict.fromkeys((r["setup"], r["workload"]) for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    panels = (
        ("peak_active", "peak active GPUs"),
        ("steady_active", "mean active GPUs (steady window)"),
        ("steady_kv_util", "KV in use / C (steady window)"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.0), squeeze=False)
    width = 0.8 / max(1, len(variants))
    mid = (len(variants) - 1) / 2
    for ax, (k, label) in zip(axes[0], panels, strict=True):
        for j, v in enumerate(variants):
            ys = [next((r[k] for r in rows if (r["setup"], r["workload"]) == g and r["variant"] == v), 0) or 0
                  for g in groups]  # fmt: skip
            ax.bar([i + (j - mid) * width for i in range(len(groups))], ys, width, label=v)
        if k == "steady_kv_util":
            ax.axhline(0.88, color="k", ls="--", lw=1.0, label="goal 0.88")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{s}\n{w}" for s, w in groups], fontsize=6, rotation=45, ha="right")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(TITLE, fontsize=9)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    p = out / "mell_headline.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return [p]
