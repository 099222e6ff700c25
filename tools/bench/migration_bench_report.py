"""The Mell migration benchmark's report: ``migration.md`` (one part per section) and its two PNGs."""

from __future__ import annotations

from pathlib import Path

from tools.bench.migration_bench_sections import variant_suffix
from tools.bench.migration_bench_setup import BASELINES, COST, GPUS, HEADLINE, MELLS, SECTIONS, SETUPS, C


def _table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    """``C.md_table`` with columns given as (key, header, format)."""
    return C.md_table(rows, [(h, k, f) for k, h, f in cols])


def markdown(res: dict, command: str) -> str:
    """``migration.md``: the setups, each section that ran, the notes and the invocations."""
    lines = _intro(res, command)
    if "headline" in res:
        lines += _headline(res["headline"])
    if "batching" in res:
        lines += _batching(res["batching"])
    if "transfer" in res:
        lines += _transfer(res["transfer"])
    lines += _footer(res)
    return "\n".join(lines)


def _intro(res: dict, command: str) -> list[str]:
    lines = [
        "# Mell migration benchmark",
        "",
        f"Command (last invocation): `{command}`",
        "",
        f"Cost source: {COST}. {C.COST_NOTE}",
        "",
    ]
    info = next((res[s]["setup"] for s in SECTIONS if s in res), None)
    if info:
        lines += [
            f"- Cluster: {info['cluster']}; setups: "
            + "; ".join(
                f"`{k}` = {v} (C = {info['kv_capacity_tokens'][k]:,} tokens, rates × {info['load_scale'][k]:.3f})"
                for k, v in info["setups"].items()
            ),
            f"- Load levels (× the conv trace's {info['trace_rate_rps']:.2f} req/s, then × the setup's "
            f"rate factor): {', '.join(f'{k} {v:g}' for k, v in info['levels'].items())}; "
            f"{info['horizon_s']:g} s of arrivals per run; prompts/outputs ≤ {info['context_tokens']} tokens.",
            "- Active GPUs: GPUs holding requests (peak over the samples, time-weighted mean to the last "
            "finish); fluid bound: Σ⌈KV(t)/C⌉ of the same run (its peak and time-weighted mean).",
            "",
        ]
    return lines


def _headline(h: dict) -> list[str]:
    lines = [
        "## 1. Headline: active GPUs (BF / WF / LB / Mell / Mell+ / Mell++)",
        "",
        "Beyond the paper: Mell+ = Mell with `fill_first` (before Allocate opens a GPU, the item goes to "
        "an active GPU of any type with room, best fit); Mell++ = Mell+ with `compact` (after the "
        "operations, each epoch, the GPU with the least KV whose items fit in the other GPUs' room, "
        "keeping 5 % of C free there, is emptied). `KV util`: KV in use / KV capacity of the active "
        "GPUs; `mem util`: the paper's GPU utilization, (weights + KV in use) / GPU memory of the active "
        "GPUs; both time-averaged over the samples with an active GPU.",
        "",
    ]
    for setup in SETUPS:
        rows = [r for r in h["rows"] if r["setup"] == setup]
        if not rows:
            continue
        lines += [f"### {SETUPS[setup][2]} ({GPUS} GPUs)", ""]
        lines += [_table(rows, [
            ("workload", "workload", ""), ("level", "level", ""), ("rate_rps", "req/s", ".1f"),
            ("variant", "policy", ""), ("peak_active", "peak", ""), ("mean_active", "mean", ".2f"),
            ("fluid_peak", "fluid peak", ""), ("fluid_mean", "fluid mean", ".2f"),
            ("peak_over_fluid", "peak/fluid", ".2f"), ("mean_over_fluid", "mean/fluid", ".2f"),
            ("mem_util", "KV util", ".3f"), ("mem_util_weights", "mem util", ".3f"),
            ("migrations_per_req", "mig/req", ".2f"),
            ("latency_p99_s", "p99 (s)", ".1f"), ("tpot_mean_ms", "TPOT (ms)", ".1f"),
            ("failed", "failed", ""),
        ]), ""]  # fmt: skip
    for v in MELLS:
        cols = [("setup", "setup", ""), ("workload", "workload", ""), ("level", "level", "")]
        for b in BASELINES:
            cols += [(f"peak_vs_{b}{variant_suffix(v)}", f"peak vs {b}", ".1%"),
                     (f"mean_vs_{b}{variant_suffix(v)}", f"mean vs {b}", ".1%")]  # fmt: skip
        if any(f"peak_vs_BF{variant_suffix(v)}" in s for s in h["savings"]):
            lines += [f"### {v}'s GPU saving vs each baseline (1 − {v} / baseline)", ""]
            lines += [_table(h["savings"], cols), ""]
    lines += [f"- {C.goal_line(g)}" for g in h["goals"].values()]
    capped = [r for r in h["rows"] if r.get("at_cluster_size") and r["variant"] not in ("WF", "LB")]
    lines += [
        f"- Runs other than WF/LB whose peak reached the cluster size ({GPUS}): "
        + (", ".join(f"{r['setup']} {r['workload']} {r['level']} {r['variant']}" for r in capped) or "none")
    ]
    lines += [""]
    return lines


def _batching(b: dict) -> list[str]:
    lines = ["## 2. Operation batching (Mell, batching on vs off)", ""]
    lines += [_table(b["rows"], [
        ("setup", "setup", ""), ("workload", "workload", ""), ("level", "level", ""),
        ("mig_per_req_on", "mig/req on", ".3f"), ("mig_per_req_off", "mig/req off", ".3f"),
        ("reduction", "reduction", ".1%"), ("planned_reduction", "planned red.", ".1%"),
        ("cancelled_on", "cancelled", ""), ("peak_on", "peak on", ""), ("peak_off", "peak off", ""),
        ("mean_on", "mean on", ".2f"), ("mean_off", "mean off", ".2f"),
        ("p99_on", "p99 on (s)", ".1f"), ("p99_off", "p99 off (s)", ".1f"),
    ]), ""]  # fmt: skip
    lines += [f"- {C.goal_line(b['goal'])}", ""]
    return lines


def _transfer(t: dict) -> list[str]:
    lines = ["## 3. Transfer: KV only, tokens only (re-prefill), hybrid", ""]
    lines += [_table(t["rows"], [
        ("setup", "setup", ""), ("workload", "workload", ""), ("level", "level", ""),
        ("transfer", "transfer", ""), ("migrations", "moves", ""), ("kv_moves", "KV moves", ""),
        ("token_moves", "token moves", ""), ("transfer_s_total", "KV transfer (s)", ".1f"),
        ("reprefill_tokens", "re-prefill tok", ""), ("deferred", "deferred", ""),
        ("latency_p99_s", "p99 (s)", ".1f"), ("tpot_mean_ms", "TPOT (ms)", ".2f"),
        ("tpot_vs_hybrid", "TPOT/hybrid", ".3f"), ("latency_vs_hybrid", "latency/hybrid", ".3f"),
        ("peak_active", "peak", ""), ("mean_active", "mean", ".2f"),
    ]), ""]  # fmt: skip
    return lines


def _footer(res: dict) -> list[str]:
    lines: list[str] = []
    if res.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in res["notes"]] + [""]
    lines += [f"Wall time: {res['wall_s']:.0f} s for the last invocation ({res.get('simulations', 0)} simulations in "
              f"{res.get('processes', 1)} processes). The sections above come from:", ""]  # fmt: skip
    lines += [f"- {k}: `{v['command']}` — {v['simulations']} simulations, {v['wall_s']:.0f} s"
              for k, v in res.get("invocations", {}).items()]  # fmt: skip
    lines += [""]
    return lines


NOTES = [
    "WF and LB use `worst_fit_kv` with `active_only=True`: among the active GPUs (holding KV or queued "
    "prompts) the one with the most free KV that holds the request's prompt KV; an idle GPU is activated only "
    "when no active one fits (the paper's 'activate a new GPU if no GPU can handle an incoming request'). "
    "LB's balancing moves requests between active GPUs only; it never activates or deactivates one.",
    "BF dispatches by the prompt's KV (no output prediction): it packs arrivals onto nearly full GPUs, where "
    "requests then wait or are preempted as their KV grows; few active GPUs come with a long queue "
    "(see p99 and TPOT) and with a lower fluid bound (queued requests hold no KV).",
    "The fluid bound is that of each run: it depends on the policy (a packed GPU decodes slower, so requests "
    "hold their KV longer; queued requests hold none).",
    "Dispatchers see an engine's queued prompts as promised KV (`EngineCandidate.kv_waiting_bytes`); a move "
    "of a request still queued carries no KV and is counted as `queued_moves`.",
    "The computation boundary of hybrid transfer is the marginal cost of re-prefill tokens fused into a "
    "decode iteration (the cost model's iteration time with and without them), within 10 % of that "
    "iteration, times the iterations in the epoch.",
    "Goals are evaluated on the KV-bound workloads; the raw-Alpaca control (`alpaca-poisson`) is reported "
    "but left out (one GPU's batch cap, not its KV, binds there).",
]


def plot(res: dict, out: Path, series: dict) -> list[Path]:
    """The active GPUs over time of the plotted run and the mean active GPUs per setup (PNGs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    if series:
        paths.append(_plot_series(plt, out, series))
    if "headline" in res:
        paths.append(_plot_mean_active(plt, out, res["headline"]["rows"]))
    return paths


def _plot_series(plt, out: Path, series: dict) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for v in HEADLINE:
        s = series.get(v)
        if s:
            ax.step(s["t"], s["active"], where="post", label=v, lw=1.2)
    s = series.get("Mell")
    if s:
        ax.step(s["t"], s["fluid"], where="post", color="k", ls="--", lw=1.0, label="fluid bound (Mell run)")
    meta = series.get("_meta", {})
    ax.set_xlabel("time (s)")
    ax.set_ylabel("active GPUs")
    ax.set_title(f"Active GPUs over time: {meta.get('title', '')}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    p = out / "migration_active_gpus.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _plot_mean_active(plt, out: Path, rows: list[dict]) -> Path:
    setups = [s for s in SETUPS if any(r["setup"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(setups), figsize=(5.5 * len(setups), 4.0), squeeze=False)
    for ax, setup in zip(axes[0], setups, strict=True):
        rs = [r for r in rows if r["setup"] == setup]
        groups = list(dict.fromkeys((r["workload"], r["level"]) for r in rs))
        width = 0.8 / len(HEADLINE)
        mid = (len(HEADLINE) - 1) / 2
        for j, v in enumerate(HEADLINE):
            ys = [next((r["mean_active"] for r in rs if (r["workload"], r["level"]) == g and r["variant"] == v), 0)
                  for g in groups]  # fmt: skip
            ax.bar([i + (j - mid) * width for i in range(len(groups))], ys, width, label=v)
        fl = [next((r["fluid_mean"] for r in rs if (r["workload"], r["level"]) == g and r["variant"] == "Mell"), 0)
              for g in groups]  # fmt: skip
        ax.scatter(
            [i + (HEADLINE.index("Mell") - mid) * width for i in range(len(groups))],
            fl,
            marker="_",
            s=150,
            color="k",
            zorder=3,
            label="fluid mean (Mell run)",
        )
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{w}\n{lv}" for w, lv in groups], fontsize=6, rotation=45, ha="right")
        ax.set_ylabel("mean active GPUs")
        ax.set_title(SETUPS[setup][2], fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    p = out / "migration_mean_active.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
