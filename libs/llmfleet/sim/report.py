"""Simulation reports: JSON, a markdown table (one row per policy) and matplotlib PNG plots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from llmfleet.sim.run import Experiment

COLUMNS = (
    ("policy", "policy"),
    ("done", "completed"),
    ("failed", "failed"),
    ("lat mean s", "latency_mean"),
    ("lat p99 s", "latency_p99"),
    ("TTFT mean s", "ttft_mean"),
    ("TPOT mean ms", "tpot_mean_ms"),
    ("norm lat mean", "norm_mean"),
    ("norm lat p99", "norm_p99"),
    ("SLO SeaLLM", "slo_seallm"),
    ("SLO Aladdin", "slo_aladdin"),
    ("SLO UELLM", "slo_uellm"),
    ("req/s", "rps"),
    ("tok/s", "tps"),
    ("GPU·s busy", "gpu_s"),
    ("GPU·s", "gpu_s_in_use"),
    ("GPUs mean", "gpus_mean"),
    ("KV util mean", "kv_mean"),
    ("preempt", "preemptions"),
)


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class TableRun(Protocol):
    """What a row of :func:`markdown_table` reads of a run: its policy's name and its report (an
    :class:`~llmfleet.sim.run.Experiment`, or a live run's report)."""

    @property
    def policy(self) -> _Named: ...

    @property
    def report(self) -> dict: ...


def row(e: TableRun) -> dict:
    o, c = e.report["overall"], e.report["cluster"]
    slo = o["slo"]
    return {
        "policy": e.policy.name,
        "completed": o["completed"],
        "failed": o["failed"],
        "latency_mean": o["latency_s"]["mean"],
        "latency_p99": o["latency_s"]["p99"],
        "ttft_mean": o["ttft_s"]["mean"],
        "tpot_mean_ms": 1e3 * o["tpot_s"]["mean"],
        "norm_mean": o["normalized_latency"]["mean"],
        "norm_p99": o["normalized_latency"]["p99"],
        "slo_seallm": slo.get("seallm"),
        "slo_aladdin": slo.get("aladdin"),
        "slo_uellm": slo.get("uellm"),
        "rps": c["throughput_rps"],
        "tps": c["throughput_tokens_per_s"],
        "gpu_s": c["gpu_seconds_busy"],
        "gpu_s_in_use": c.get("gpu_seconds"),
        "gpus_mean": c.get("mean_gpus_in_use"),
        "kv_mean": c["kv_utilization_mean"],
        "preemptions": o["preemptions"],
    }


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if v != 0 and (abs(v) >= 1e4 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def markdown_table(experiments: Sequence[TableRun]) -> str:
    rows = [row(e) for e in experiments]
    cols = [(h, k) for h, k in COLUMNS if any(r[k] is not None for r in rows)]
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r[k]) for _, k in cols) + " |" for r in rows]
    return "\n".join(lines)


def markdown(experiments: Sequence[Experiment], title: str, context: str = "") -> str:
    parts = [f"# {title}", ""]
    if context:
        parts += [context, ""]
    parts += [markdown_table(experiments), ""]
    for e in experiments:
        parts.append(f"- **{e.policy.name}**: {e.policy.description or ''} ({len(e.plan)} instances; "
                     f"wall {e.result.wall_s:.2f} s, {e.result.events} events)")  # fmt: skip
    for e in experiments:
        parts += placement_lines(e)
    return "\n".join(parts) + "\n"


def placement_lines(e: Experiment, limit: int = 40) -> list[str]:
    """The placement decisions of a run with a placement loop, as a markdown table (the first ``limit``)."""
    decisions = e.result.placement
    if not decisions:
        return []
    out = ["", f"## Placement decisions: {e.policy.name}", "",
           "| t s | status | plan | GPUs | moves | changes / error |", "|---|---|---|---|---|---|"]  # fmt: skip
    for d in decisions[:limit]:
        what = d["error"] or "; ".join(d["changes"]) or "–"
        out.append(
            f"| {d['t']:.1f} | {d['status']} | {d['plan']} | {d['gpus_in_use']} | {d['moves']} | {what} |"
        )
    if len(decisions) > limit:
        out.append(f"| … | {len(decisions) - limit} more in report.json | | | | |")
    return out


def _plots(experiments: Sequence[Experiment], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for e in experiments:
        lat = np.sort([r.latency_s for r in e.result.records if r.done])
        if lat.size:
            ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=e.policy.name)
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency (s)")
    ax.set_ylabel("CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "latency_cdf.png"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for e in experiments:
        log = e.result.gpu_log or [(0.0, e.result.provisioned_gpus)]
        ax.step([t for t, _ in log] + [e.result.end_s], [n for _, n in log] + [log[-1][1]], where="post",
                label=e.policy.name)  # fmt: skip
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("GPUs in use")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "gpus_in_use.png"))

    for key, label, name in (
        ("kv", "KV utilisation", "kv_utilization.png"),
        ("active_gpus", "active GPUs", "active_gpus.png"),
    ):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for e in experiments:
            s = e.result.samples
            if not s:
                continue
            t = [x.t for x in s]
            y = (
                [x.kv_used / x.kv_capacity if x.kv_capacity else 0 for x in s]
                if key == "kv"
                else [x.active_gpus for x in s]
            )
            ax.step(t, y, where="post", label=e.policy.name)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(_save(fig, out / name))

    if len(experiments) > 1:
        rows = [row(e) for e in experiments]
        metrics = [("norm_mean", "normalized latency (mean)"), ("latency_p99", "p99 latency (s)"),
                   ("slo_seallm", "SLO attainment (5× exec)")]  # fmt: skip
        fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.5))
        names = [r["policy"] for r in rows]
        for ax, (k, title) in zip(axes, metrics, strict=True):
            ax.bar(names, [r[k] or 0 for r in rows], color="tab:blue")
            ax.set_title(title, fontsize=9)
            ax.tick_params(axis="x", rotation=45, labelsize=7)
        paths.append(_save(fig, out / "comparison.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_report(
    experiments: Sequence[Experiment],
    out_dir: str | Path,
    *,
    title: str = "llmfleet simulation",
    context: str = "",
    records: bool = False,
    plots: bool = True,
) -> dict[str, Path]:
    """Write ``report.json``, ``report.md`` and the PNG plots (and ``requests.jsonl`` if asked)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "markdown": out / "report.md"}
    doc = {"title": title, "context": context, "runs": [e.report for e in experiments]}
    paths["json"].write_text(json.dumps(doc, indent=1, default=float))
    paths["markdown"].write_text(markdown(experiments, title, context))
    if records:
        paths["requests"] = out / "requests.jsonl"
        with paths["requests"].open("w") as f:
            for e in experiments:
                for r in e.result.records:
                    f.write(json.dumps({"policy": e.policy.name, **r.to_dict()}) + "\n")
    if plots:
        for p in _plots(experiments, out):
            paths[p.stem] = p
    return paths
