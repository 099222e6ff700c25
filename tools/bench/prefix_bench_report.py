"""``make bench-prefix``'s markdown (prefix.md) and plots (sim_sweep.png, users_sweep.png, emulated_*.png,
emulated_users_*.png, native.png, burst.png) from its report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SIM_COLUMNS = (
    ("TTFT mean s", "ttft_mean_s"), ("TTFT p50 s", "ttft_p50_s"), ("TTFT p99 s", "ttft_p99_s"),
    ("done req/s", "completed_rps"), ("out tok/s", "output_tokens_per_s"),
    ("window out tok/s", "window_tokens_per_s"), ("SLO", "slo_attainment"),
    ("prompt tok sent", "prompt_tokens_sent"), ("computed", "prompt_tokens_computed"), ("hit rate", "hit_rate"),
)  # fmt: skip
LIVE_COLUMNS = (
    ("TTFT mean s", "ttft_mean_s"), ("TTFT p50 s", "ttft_p50_s"), ("TTFT p99 s", "ttft_p99_s"),
    ("engines' TTFT mean s", "engine_ttft_mean_s"), ("engines' TTFT p50 s", "engine_ttft_p50_s"),
    ("done req/s", "completed_rps"), ("out tok/s", "output_tokens_per_s"),
    ("window out tok/s", "window_tokens_per_s"), ("failed", "failed"),
    ("hit rate", "hit_rate"),
)  # fmt: skip


def _f(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"


def table(rows: dict[str, dict], columns: tuple[tuple[str, str], ...]) -> list[str]:
    lines = ["| setup | " + " | ".join(c for c, _ in columns) + " |", "|---" + "|---:" * len(columns) + "|"]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(_f(row.get(k)) for _, k in columns) + " |")
    return [*lines, ""]


def _goals(goals: dict[str, Any]) -> list[str]:
    return [*(f"- {k}: **{v}**" for k, v in goals.items()), ""]


def sim_lines(s: dict, section: str) -> list[str]:
    w = s["workload"]
    unit = w.get("unit", "conv/s")
    how = (
        f"a closed population of users for {w['span_s']:g} s" if unit == "users"
        else f"conversations for {w['span_s']:g} s"
    )  # fmt: skip
    lines = [
        f"## Simulated ({section}): {s['gpus']} A100-80GB (`llmfleet sim`)", "",
        f"Workload: {how}, {w['system_tokens']}-token system prompt, "
        f"{w['mean_turns']} turns mean, {w['think_s']:g} s think, {w['max_context']} max context. "
        f"Swept {unit}: {', '.join(s['sweep'])}. JSQ's SLO load: {s['loads']['slo']} {unit}; "
        f"each setup's first saturated load: {s['loads']['saturation']}.", "",
        f"Ratios (prefix_affinity/cache over jsq/cache): {s['ratios']}", "", *_goals(s["goals"]),
    ]  # fmt: skip
    if s["at"].get("slo"):
        lines += [
            f"### At JSQ's SLO load ({s['loads']['slo']} {unit})",
            "",
            *table(s["at"]["slo"], SIM_COLUMNS),
        ]
    if s["at"].get("saturation"):
        lines += [
            "### At saturation (each setup where it sustains the most window tokens/s, at or past its first saturated load)",
            "",
        ]
        lines += table(s["at"]["saturation"], ((unit, "rate"), *SIM_COLUMNS))
    return lines


def groups_lines(g: dict) -> list[str]:
    lines = [
        "## Simulated: llm-d's shared-prefix workload", "",
        f"Deployment: {g['deployment']}. Workload: {g['workload']['flags']}, {g['workload']['requests']} "
        f"requests a run. Swept req/s: {', '.join(g['sweep'])}. JSQ's SLO load: {g['loads']['slo']} req/s; "
        f"each setup's first saturated rate: {g['loads']['saturation']}.", "",
        *(f"- {k}: **{_f(v)}**" for k, v in g["ratios"].items()), "",
    ]  # fmt: skip
    if g["at"].get("slo"):
        lines += [
            f"### At JSQ's SLO load ({g['loads']['slo']} req/s)",
            "",
            *table(g["at"]["slo"], SIM_COLUMNS),
        ]
    if g["at"].get("saturation"):
        lines += ["### At saturation", "", *table(g["at"]["saturation"], (("req/s", "rate"), *SIM_COLUMNS))]
    live = g.get("live")
    if live:
        rows = {f"{name} {side}": run[side] for name, run in live["runs"].items() for side in ("live", "sim")}
        lines += [
            f"### Live on {g['deployment'].split(',')[0]} (emulated) at JSQ's SLO load ({live['rate']:g} req/s, "
            f"{live['requests']} requests)",
            "",
            f"prefix_affinity / JSQ mean TTFT, live: **{_f(live['ttft_mean_ratio'])}**",
            "",
            *table(rows, LIVE_COLUMNS),
        ]
    return lines


def emulated_lines(e: dict, section: str) -> list[str]:
    unit = e.get("unit", "conv/s")
    workload = "the closed population of users" if section == "emulated-users" else "the open stream"
    lines = [
        f"## Live on {e['gpus']} emulated A100-80GB vs `llmfleet sim`: {workload}", "",
        f"Loads (same rule, simulated sweep at {e['gpus']} GPUs): {e['loads']} ({unit}). Live ratios "
        f"(prefix_affinity/cache over jsq/cache): {e['ratios']}", "",
    ]  # fmt: skip
    for load, runs in e["runs"].items():
        where = (
            f"{e['loads']['slo']} {unit}"
            if load == "slo"
            else "each setup at its first saturated load in the simulated sweep"
        )
        lines += [
            f"### At {load} ({where}): live",
            "",
            *table(
                {k: {"rate": v.get("rate"), **v["live"]} for k, v in runs.items()},
                ((unit, "rate"), *LIVE_COLUMNS),
            ),
        ]
        lines += ["Live over simulated (1 = equal; goal within 15% on TTFT p50 and throughput):", "",
                  "| setup | TTFT p50 live/sim | engines' TTFT p50 live/sim | out tok/s live/sim | window tok/s live/sim | TTFT mean live/sim | engines' TTFT mean live/sim | sim TTFT p50 s | sim out tok/s | sim window tok/s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for name, run in runs.items():
            r, sim = run["live_over_sim"], run["sim"]
            lines.append(
                f"| {name} | {_f(r['ttft_p50_s'])} | {_f(r.get('engine_ttft_p50_s'))} | {_f(r['output_tokens_per_s'])} | "
                f"{_f(r['window_tokens_per_s'])} | {_f(r['ttft_mean_s'])} | {_f(r.get('engine_ttft_mean_s'))} | "
                f"{_f(sim.get('ttft_p50_s'))} | {_f(sim.get('output_tokens_per_s'))} | {_f(sim.get('window_tokens_per_s'))} |"
            )
        lines += ["", "The engines' TTFT is each engine's own, from its receipt of the request (the simulator's "
                  "engines receive each request at its arrival); the client's adds the load generator, the SDK "
                  "and the scheduler's hops.", ""]  # fmt: skip
        lines.append("")
    return lines


def native_lines(n: dict) -> list[str]:
    return [
        f"## Native CPU engines: {n['engines']} engines × {n['threads_per_engine']} thread, random llama", "",
        f"{n['rate']} conversations/s for {n['workload']['span_s']:g} s, {n['workload']['system_tokens']}-word "
        f"system prompt, at most {n['workload']['max_context']} words of context.", "",
        *table(n["runs"], (*LIVE_COLUMNS, ("wall s", "wall_s"))),
    ]  # fmt: skip


def burst_lines(b: dict) -> list[str]:
    lines = [
        "## Burst: 500 same-prefix requests over 4 engines (prefix_affinity)",
        "",
        f"`{b['workload']}`",
        "",
    ]
    for side in ("sim", "live"):
        r = b.get(side)
        if r and "shares" in r:
            lines.append(
                f"- {side}: shares {r['shares']}, max {r['max_share']}: no engine > 50%: **{r['goal met (no engine > 50%)']}**"
            )
        elif r:
            lines.append(f"- {side}: {r}")
    return [*lines, ""]


def markdown(report: dict) -> str:
    lines = [
        "# Prefix caching and cache-aware dispatch (`make bench-prefix`)",
        "",
        f"Machine: {report['machine']}",
    ]
    lines += [f"Quick: {report.get('quick')}", ""]
    for section in ("sim", "users"):
        if report.get(section):
            lines += sim_lines(report[section], section)
    if report.get("groups"):
        lines += groups_lines(report["groups"])
    for section in ("emulated", "emulated-users"):
        if report.get(section):
            lines += emulated_lines(report[section], section)
    if report.get("native"):
        lines += native_lines(report["native"])
    if report.get("burst"):
        lines += burst_lines(report["burst"])
    return "\n".join(lines) + "\n"


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for section in ("sim", "users"):
        s = report.get(section)
        if s and s.get("sweep"):
            _sweep(s, out / f"{section}_sweep.png", plt)
    _bars(report.get("native", {}).get("runs"), "native CPU engines", out / "native.png", plt)
    for section in ("emulated", "emulated-users"):
        for load, runs in (report.get(section) or {}).get("runs", {}).items():
            name = section.replace("-", "_")
            _bars(
                {k: v["live"] for k, v in runs.items()}, f"{section}, {load}", out / f"{name}_{load}.png", plt
            )
    b = report.get("burst")
    if b:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for i, side in enumerate(("sim", "live")):
            sh = (b.get(side) or {}).get("shares") or {}
            ax.bar([x + 0.4 * i for x in range(len(sh))], list(sh.values()), width=0.4, label=side)
        ax.axhline(0.5, color="gray", ls="--")
        ax.set_ylabel("share of the burst")
        ax.set_xlabel("engine")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "burst.png", dpi=110)
        plt.close(fig)


def _sweep(s: dict, path: Path, plt: Any) -> None:
    """TTFT and the window's tokens/s of every setup over a sweep's loads."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    rates = [float(r) for r in s["sweep"]]
    names = list(next(iter(s["sweep"].values())))
    for name in names:
        rows = [s["sweep"][k].get(name) or {} for k in s["sweep"]]
        style = "-" if name.endswith("/cache") else "--"
        a1.plot(rates, [r.get("ttft_mean_s") or float("nan") for r in rows], "o" + style, label=name)
        a2.plot(rates, [r.get("window_tokens_per_s") or float("nan") for r in rows], "o" + style, label=name)
    unit = s["workload"].get("unit", "conv/s")
    for ax, label in ((a1, "TTFT mean (s)"), (a2, "output tokens/s in the window")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("users" if unit == "users" else "conversations/s")
        ax.set_ylabel(label)
    a1.set_yscale("log")
    a1.legend(fontsize=8)
    fig.suptitle(f"llmfleet sim, {s['gpus']} A100-80GB, {unit}: dispatch × prefix caching")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(runs: dict[str, dict] | None, title: str, path: Path, plt: Any) -> None:
    if not runs:
        return
    names = list(runs)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    x = range(len(names))
    a1.bar([i - 0.2 for i in x], [runs[n].get("ttft_p50_s") or 0 for n in names], width=0.4, label="p50")
    a1.bar([i + 0.2 for i in x], [runs[n].get("ttft_p99_s") or 0 for n in names], width=0.4, label="p99")
    a1.set_ylabel("TTFT (s)")
    a1.legend()
    a2.bar(list(x), [runs[n].get("window_tokens_per_s") or 0 for n in names])
    a2.set_ylabel("output tokens/s in the window")
    for ax in (a1, a2):
        ax.set_xticks(list(x), names, rotation=20, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
