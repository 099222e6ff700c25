"""Mell (multi-GPU KV migration): active GPUs and KV utilization against BF, WF and LB.

The setup, the policies and the goals are those of ``tools/bench/migration_bench.py`` (``make
bench-migration``; its docstring quotes the paper's §6 and says how each piece maps here). This module
runs that bench's headline section in this process, so that ``make bench-papers`` gives the Mell row
beside the other papers' from one command:

- 40 GPUs, one model instance per GPU: Llama-2-7B on A100-40GB and on RTX 4090, Llama-2-13B on
  A100-40GB (the paper's models and GPUs).
- Workloads: conv-trace lengths with Poisson arrivals, the trace's own arrivals, Alpaca lengths × 10.
- Policies: BF, WF, LB (the paper's baselines, counted the paper's way), Mell (the paper's rules) and,
  beyond the paper, Mell+ (``fill_first``) and Mell++ (``fill_first`` + ``compact``).
- Goals as issue 24 counts them: mean KV in use / C ≥ 88 % (C = "the memory capacity for the KV cache
  in each GPU"), 9–31 % fewer peak GPUs (Eq. 3) than each baseline, and Theorem 2's bound with its
  additive constant (peak ≤ 4/3 × fluid bound + 3).

Sizes: the full run is the ``mid`` load (10 × the trace's mean rate, scaled by each setup's KV
capacity), 60 s of arrivals, 9 KV-bound runs × 6 policies = 54 simulations — the same runs as
``migration_bench.py --quick --only headline`` (the three-level sweep is ``make bench-migration``).
``quick``: conv-poisson only (3 runs × 6 policies); ``tiny``: one 10 s run per policy on A100-7B.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from . import common as C

NAME = "mell"
TITLE = "Mell — KV migration, active GPUs and KV utilization vs BF / WF / LB (40 GPUs per setup)"
CLAIM = (
    "Mell reduces the number of GPUs needed by 9–31 % against the baselines and keeps GPU utilization up to "
    "43 % higher (lowest average 88 %); Theorem 2: |A(I)| ≤ 4/3·OPT(I) + c."
)
BENCH = Path(__file__).resolve().parents[1] / "migration_bench.py"
_MODULE = "llmfleet_papers_migration_bench"


def bench() -> ModuleType:
    """``tools/bench/migration_bench.py``, loaded by path once."""
    if _MODULE in sys.modules:
        return sys.modules[_MODULE]
    spec = importlib.util.spec_from_file_location(_MODULE, BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = mod
    spec.loader.exec_module(mod)
    return mod


def settings(quick: bool, tiny: bool) -> dict:
    if tiny:
        return {"setups": ("a100-7b",), "kinds": ("conv-poisson",), "levels": ("mid",), "horizon_s": 10.0,
                "samples": 100}  # fmt: skip
    if quick:
        return {
            "setups": None,
            "kinds": ("conv-poisson",),
            "levels": ("mid",),
            "horizon_s": 60.0,
            "samples": 400,
        }
    # = migration_bench.py --quick --only headline (the KV-bound workloads at the mid load)
    return {"setups": None, "kinds": None, "levels": ("mid",), "horizon_s": 60.0, "samples": 400}


def _simulate(MB: ModuleType):
    """The simulator with the cost source run.py selected (``--cost-source``)."""

    def simulate(spec, *args, **kwargs):
        return MB.simulate_base(dataclasses.replace(spec, cost_source=C.COST_SOURCE), *args, **kwargs)

    return simulate


def _plain(x: Any) -> Any:
    """JSON-ready: numpy scalars to Python ones."""
    return json.loads(json.dumps(x, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def run(quick: bool = False, log: C.Log = print, tiny: bool = False) -> dict:
    t0 = time.perf_counter()
    MB = bench()
    MB.C.TRACE, MB.C.ALPACA = C.TRACE, C.ALPACA  # the same data as the other scenarios (tests swap them)
    if not hasattr(MB, "simulate_base"):
        MB.simulate_base = MB.simulate
    MB.simulate = _simulate(MB)
    cfg = settings(quick, tiny)
    mcfg = {
        "levels": cfg["levels"],
        "horizon_s": cfg["horizon_s"],
        "alpaca_control": False,
        "samples": cfg["samples"],
    }
    setups = list(cfg["setups"] or MB.SETUPS)
    pairs = [(k, lv) for k, lv in MB.workloads(mcfg) if cfg["kinds"] is None or k in cfg["kinds"]]
    jobs = [
        (setup, kind, level, v, cfg["horizon_s"], cfg["samples"])
        for setup in setups
        for kind, level in pairs
        for v in MB.HEADLINE
    ]
    log(f"  mell: {len(jobs)} simulations in this process")
    rows = MB.run_all(jobs, 1, lambda m: log(f"  mell {m.strip()}"))
    for r in rows:
        r.pop("_series", None)
    head = MB.headline_section(rows, mcfg)
    result = {
        "paper": NAME,
        "title": TITLE,
        "setup": {
            "cluster": f"{MB.GPUS} GPUs per setup, one model instance per GPU: "
            + "; ".join(f"`{k}` = {MB.SETUPS[k][2]}" for k in setups),
            "workload": f"{', '.join(dict.fromkeys(k for k, _ in pairs))} at the {'/'.join(cfg['levels'])} load "
            f"({'/'.join(f'{MB.LEVELS[lv]:g}' for lv in cfg['levels'])} × the conv trace's mean rate, × the "
            f"setup's KV capacity relative to A100-7B), {cfg['horizon_s']:g} s of arrivals; prompts/outputs ≤ "
            f"{MB.CONTEXT} tokens",
            "policies": "BF (best fit by free KV), WF (worst fit among active GPUs), LB (WF + Llumnix "
            "load-balancing migration), Mell (the paper's dispatch + packer, 1 s epochs, operation batching, "
            "hybrid transfer); beyond the paper: Mell+ (fill_first), Mell++ (fill_first + compact)",
            "bench": "the headline section of tools/bench/migration_bench.py (make bench-migration)",
            "cost model": f"{C.cost_label()}; catalog a100-40gb, rtx-4090 × llama2-7b, llama2-13b",
        },
        "workload": "conv trace (Poisson and its own arrivals), Alpaca × 10",
        "cost_source": C.COST_SOURCE,
        "rows": rows,
        "savings": head["savings"],
        "goals": head["goals"],
        "settings": {**cfg, "setups": setups, "levels": list(cfg["levels"])},
        "wall_s": 0.0,
    }
    _summarize(result)
    result["wall_s"] = time.perf_counter() - t0
    return _plain(result)


def _pct(x: float) -> str:
    """A percentage, to one decimal where a whole number would read as 0 or −0."""
    p = 100 * x
    return f"{p:.1f}" if p != 0 and abs(p) < 0.5 else f"{p:.0f}"


def _pct_range(rng: list[float] | None) -> str:
    return "–" if not rng else f"{_pct(rng[0])}…{_pct(rng[1])} %"


def _summarize(res: dict) -> None:
    g = res["goals"]
    util, save, theorem, fluid = g["util"], g["savings"], g["theorem"], g["fluid"]
    kvu = [r["mem_util"] for r in res["rows"] if r["variant"] == "Mell"]
    r = save["ranges"]
    sums = {
        v: (
            sum(x["peak_active"] for x in res["rows"] if x["variant"] == v),
            sum(x["mean_active"] for x in res["rows"] if x["variant"] == v),
        )
        for v in ("BF", "WF", "LB", "Mell", "Mell+", "Mell++")
    }
    res["summary"] = {
        "runs": len(kvu),
        "kv_util_min": util["min"],
        "kv_util_max": max(kvu, default=None),
        "kv_util_at_88": sum(u >= 0.88 for u in kvu),
        "peak_saving": {b: r[f"peak_vs_{b}"] for b in ("BF", "WF", "LB")},
        "mean_saving": {b: r[f"mean_vs_{b}"] for b in ("BF", "WF", "LB")},
        "theorem_runs": theorem["met_runs"],
        "fluid_110_runs": fluid["met_runs"],
        "sum_peak_mean": sums,
        "plus": {k: g[f"{k}_plus"]["ours_text"] for k in ("util", "savings", "theorem") if f"{k}_plus" in g},
        "plusplus": {
            k: g[f"{k}_plusplus"]["ours_text"] for k in ("util", "savings", "theorem") if f"{k}_plusplus" in g
        },
    }
    res["claim"] = CLAIM
    res["goal"] = {
        "text": "Mell: ≥ 88 % average KV utilization (KV in use / C), and 9–31 % fewer GPUs (peak) than BF, WF "
        "and LB",
        "ours_text": f"KV in use / C {C.fmt(util['min'], '.3f')}–{C.fmt(max(kvu, default=None), '.3f')} "
        f"({sum(u >= 0.88 for u in kvu)}/{len(kvu)} runs ≥ 0.88); peak GPUs vs WF {_pct_range(r['peak_vs_WF'])}, "
        f"vs LB {_pct_range(r['peak_vs_LB'])}, vs BF {_pct_range(r['peak_vs_BF'])}; time-averaged vs WF "
        f"{_pct_range(r['mean_vs_WF'])}, vs LB {_pct_range(r['mean_vs_LB'])}; peak ≤ 4/3 × fluid bound + "
        f"{bench().THEOREM_ADDITIVE} in {theorem['met_runs']}/{theorem['runs']} runs",
        "met": bool(util["met"] and save["met"]),
        "util": util,
        "savings": save,
        "theorem": theorem,
        "fluid": fluid,
    }
    res["ours"] = (
        f"{util['ours_text']}. {save['ours_text']}. Theorem 2's bound: {theorem['ours_text']}; within 1.10 × the "
        f"fluid bound: {fluid['ours_text']}. Σ peak / mean active GPUs: "
        + ", ".join(f"{v} {p} / {m:.1f}" for v, (p, m) in sums.items())
        + "."
    )
    res["notes"] = [
        "Unused KV room on the open GPUs, (1 − KV/C) × mean active GPUs, per Mell run: "
        + ", ".join(
            f"{x['setup']} {x['workload']} {C.fmt((1 - x['mem_util']) * x['mean_active'], '.1f')}"
            for x in res["rows"]
            if x["variant"] == "Mell"
        )
        + " GPUs. Theorem 2's additive constant (the open T-, S- and M-GPUs) is of that size, and at 8–20 "
        "active GPUs it alone keeps KV / C below 0.88.",
        "The fluid bound Σ⌈KV(t)/C⌉ of a run is a lower bound on any policy's peak on that run; where a "
        "baseline's peak is within 9 % of its own bound, no policy can save 9 % at the peak.",
        "Beyond the paper: Mell+ "
        + "; ".join(res["summary"]["plus"].values())
        + ". Mell++ "
        + "; ".join(res["summary"]["plusplus"].values())
        + ".",
        *bench().NOTES,
    ]


COLUMNS = (
    ("setup", "setup", ""),
    ("workload", "workload", ""),
    ("req/s", "rate_rps", ".1f"),
    ("policy", "variant", ""),
    ("peak", "peak_active", ""),
    ("mean", "mean_active", ".2f"),
    ("fluid peak", "fluid_peak", ""),
    ("fluid mean", "fluid_mean", ".2f"),
    ("peak/fluid", "peak_over_fluid", ".2f"),
    ("KV / C", "mem_util", ".3f"),
    ("(weights+KV) / mem", "mem_util_weights", ".3f"),
    ("mig/req", "migrations_per_req", ".2f"),
    ("p99 s", "latency_p99_s", ".1f"),
    ("failed", "failed", ""),
)


def markdown(res: dict) -> str:
    extra = ["Mell's GPU saving vs each baseline (1 − Mell / baseline):", ""]
    cols = [("setup", "setup", ""), ("workload", "workload", "")]
    for b in ("BF", "WF", "LB"):
        cols += [(f"peak vs {b}", f"peak_vs_{b}", ".1%"), (f"mean vs {b}", f"mean_vs_{b}", ".1%")]
    extra.append(C.md_table(res["savings"], cols))
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
        ("mean_active", "mean active GPUs"),
        ("mem_util", "KV in use / C"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.0), squeeze=False)
    width = 0.8 / max(1, len(variants))
    mid = (len(variants) - 1) / 2
    for ax, (k, label) in zip(axes[0], panels, strict=True):
        for j, v in enumerate(variants):
            ys = [next((r[k] for r in rows if (r["setup"], r["workload"]) == g and r["variant"] == v), 0) or 0
                  for g in groups]  # fmt: skip
            ax.bar([i + (j - mid) * width for i in range(len(groups))], ys, width, label=v)
        if k == "mem_util":
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
