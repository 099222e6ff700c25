"""The report's markdown (tables, the explanation of the residual, diagnostics) and its files."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .metrics import COMPARED, HEADLINE, rel_diff
from .workload import GOAL, MODEL, VARIANTS


def pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:+.1f}%"


def _ms(values: Iterable[float]) -> str:
    return ", ".join(f"{v * 1e3:.2f}" for v in values)


def _table(
    title: str, live: dict[str, float], sims: dict[str, Any], extra: dict[str, list[str]] | None = None
) -> list[str]:
    """A markdown table: metric, live value, optional extra columns, then sim value and diff per variant."""
    extra = extra or {}
    head = f"| metric | {title} |" + "".join(f" {c} |" for c in extra)
    head += "".join(f" sim: {VARIANTS[v]} | diff |" for v in sims)
    lines = [head, "|---|---:|" + "---:|" * len(extra) + "---:|---:|" * len(sims)]
    for i, (key, label) in enumerate(k for k in COMPARED if k[0] in live):
        row = f"| {label} | {live[key]:.4g} |" + "".join(f" {col[i]} |" for col in extra.values())
        row += "".join(
            f" {x['summary'][key]:.4g} | {pct(rel_diff(x['summary'][key], live[key]))} |"
            for x in sims.values()
        )
        lines.append(row)
    return lines


def explain(report: dict[str, Any]) -> list[str]:
    """What separates live and simulated numbers, with this run's figures."""
    lines = ["## What explains the residual", ""]
    lines += _explain_fits(report)
    lines += _explain_deployed(report)
    lines += _explain_direct(report)
    lines += _explain_little(report)
    lines.append(
        "- A mixed iteration (prefills joining running decodes) is one forward in the engine; the "
        "simulator charges prefill + decode minus their shared fixed cost (min(c1, c3)), not both."
    )
    return lines


def _explain_fits(report: dict[str, Any]) -> list[str]:
    """Throughput, the raw fit and the engine-side calibration against the live runs."""
    live, noise, sims = report["live"]["summary"], report["live"]["spread"], report["sim"]
    lines: list[str] = []
    raw = sims["raw"]["summary"]
    lines.append(
        f"- Throughput is set by the arrivals at this load (the engine idles between bursts): raw and "
        f"calibrated sims are within {100 * abs(rel_diff(raw['throughput_rps'], live['throughput_rps'])):.1f}% "
        "whatever the cost model."
    )
    lines.append(
        f"- Raw fit: latency {pct(rel_diff(raw['latency_mean_s'], live['latency_mean_s']))}. The Profile sweep "
        "times only the forward pass on an otherwise idle worker thread; a serving iteration also plans the "
        "batch, samples, detokenizes and hands chunks to the engine's gRPC thread (same GIL), and the "
        "engine shares two cores with the scheduler, the client and other users' jobs. For the tiny model a "
        "forward is ~1 ms, so this overhead dominates."
    )
    cal = report.get("calibration")
    if cal and "calibrated" in sims:
        c = sims["calibrated"]["summary"]
        lone = [g["iteration_s"] for g in cal["groups"] if g["batch"] == 1]
        lines.append(
            f"- Calibrated (engine-side overhead from separate requests): mean latency "
            f"{pct(rel_diff(c['latency_mean_s'], live['latency_mean_s']))}, mean TPOT "
            f"{pct(rel_diff(c['tpot_mean_s'], live['tpot_mean_s']))} against a live run-to-run spread of "
            f"{100 * noise['latency_mean_s']:.0f}% / {100 * noise['tpot_mean_s']:.0f}%."
        )
        if lone:
            lines.append(
                f"- Shape of the distribution: the same lone decode iteration took {min(lone) * 1e3:.2f} to "
                f"{max(lone) * 1e3:.2f} ms across the calibration groups (quiet vs contended periods of the "
                "shared machine). The simulator runs one deterministic mean speed, so it over-predicts the "
                f"median (p50 {pct(rel_diff(c['latency_p50_s'], live['latency_p50_s']))}) and under-predicts "
                f"the tail (p99 {pct(rel_diff(c['latency_p99_s'], live['latency_p99_s']))}): live tails come "
                "from contended stretches and stalls, amplified by queueing (the live p99 itself moved "
                f"{100 * noise['latency_p99_s']:.0f}% between identical runs)."
            )
    return lines


def _explain_deployed(report: dict[str, Any]) -> list[str]:
    """The calibration as deployed (the groups through the SDK and the scheduler)."""
    live, sims = report["live"]["summary"], report["sim"]
    cal = report.get("calibration")
    lines: list[str] = []
    dep = (cal or {}).get("deployed")
    if dep and "deployed" in sims:
        x = sims["deployed"]["summary"]
        lines.append(
            f"- Calibrated as deployed (the calibration groups sent through the SDK and the scheduler): mean "
            f"latency {pct(rel_diff(x['latency_mean_s'], live['latency_mean_s']))}, TTFT "
            f"{pct(rel_diff(x['ttft_mean_s'], live['ttft_mean_s']))}, TPOT "
            f"{pct(rel_diff(x['tpot_mean_s'], live['tpot_mean_s']))}, p99 "
            f"{pct(rel_diff(x['latency_p99_s'], live['latency_p99_s']))}. The hops "
            f"({dep['hop_s'] * 1e3:.1f} ms per request) and the relay's share of the cores are what the "
            "engine-side calibration misses. The p99 stays short: the slowest requests arrive in bursts, "
            "where live iterations (larger batches, longer contexts, prefills mixed in) run slower than the "
            "linear calibration from groups of at most "
            f"{max(g['batch'] for g in dep['groups'])} requests with {report['settings']['calib_prompt']}-token "
            "prompts predicts."
        )
        direct = report.get("direct")
        if direct and "calibrated" in sims:
            e = direct["engine_side"]
            lines.append(
                f"  The engine alone shows the same short tail (calibrated sim p99 "
                f"{pct(rel_diff(sims['calibrated']['summary']['latency_p99_s'], e['latency_p99_s']))} on the "
                "engine's clock), so it is the engine's iteration model, not the relay."
            )
    return lines


def _explain_direct(report: dict[str, Any]) -> list[str]:
    """TTFT and latency on the engine's own clock (the direct run) against the cluster."""
    live, sims = report["live"]["summary"], report["sim"]
    lines: list[str] = []
    direct = report.get("direct")
    if direct and "calibrated" in sims:
        c, e = sims["calibrated"]["summary"], direct["engine_side"]
        lines.append(
            f"- TTFT: on the engine's own clock (direct run) mean TTFT is {e['ttft_mean_s'] * 1e3:.1f} ms vs "
            f"{c['ttft_mean_s'] * 1e3:.1f} ms simulated; on the client it is {live['ttft_mean_s'] * 1e3:.1f} ms: "
            "the client -> scheduler -> engine hops, prompt validation and tokenization (before the engine's "
            "arrival stamp) and the way back, none of which the simulator models. The same path adds "
            f"{report['diagnostics']['client_minus_scheduler_latency_mean_s'] * 1e3:.1f} ms per request between "
            "client and scheduler alone."
        )
        lines.append(
            f"- Engine vs cluster: the direct run on the engine's clock has mean latency "
            f"{e['latency_mean_s'] * 1e3:.1f} ms (calibrated sim {pct(rel_diff(c['latency_mean_s'], e['latency_mean_s']))}),"
            f" the cluster runs {live['latency_mean_s'] * 1e3:.1f} ms on the client."
        )
    return lines


def _explain_little(report: dict[str, Any]) -> list[str]:
    """Time in the engine per request (Little's law) in the cluster runs and the direct run."""
    live, sims = report["live"]["summary"], report["sim"]
    lines: list[str] = []
    little = report["diagnostics"].get("engine_little_latency_s") or {}
    if little.get("cluster") and "direct" in little and "calibrated" in sims:
        eng = float(np.mean(little["cluster"]))
        c = sims["calibrated"]["summary"]
        lines.append(
            f"- Where the cluster's extra time goes: by the engine's own WatchLoad (Little's law) a request "
            f"spent {eng * 1e3:.1f} ms in the engine during the cluster runs vs {little['direct'] * 1e3:.1f} ms "
            f"in the direct run (calibrated sim: {c['latency_mean_s'] * 1e3:.1f} ms), and "
            f"{live['latency_mean_s'] * 1e3:.1f} ms on the client. The difference between the two engine "
            "figures is the engine running slower while the scheduler and the SDK client relay every token "
            "on the same two cores; the rest is the relay path itself."
        )
    return lines


def little_lines(report: dict[str, Any]) -> list[str]:
    """Engine-side mean latency of every run from the engine's WatchLoad (Little's law)."""
    little = report["diagnostics"].get("engine_little_latency_s") or {}
    if not little.get("cluster"):
        return []
    line = (
        "- time in the engine per request, from the engine's own WatchLoad snapshots (Little's law, "
        f"∫(running + waiting)dt / requests): cluster runs {_ms(little['cluster'])} ms"
    )
    if "direct" in little and report.get("direct"):
        line += (
            f"; direct run {little['direct'] * 1e3:.2f} ms (its Usage says "
            f"{report['direct']['engine_side']['latency_mean_s'] * 1e3:.2f} ms)"
        )
    return [line]


def render_markdown(report: dict[str, Any]) -> str:
    """``sim_fidelity.md``: the comparisons, the cost model, the calibrations, the explanation and the
    diagnostics."""
    lines = _headline(report)
    lines += _other_clocks(report)
    lines += _fit_lines(report["fit"])
    lines += _calibration_lines(report)
    lines += ["", *explain(report)]
    lines += _diagnostics(report)
    return "\n".join(lines)


def _headline(report: dict[str, Any]) -> list[str]:
    """The setup, live vs each simulation (with the live runs and their spread) and the goal."""
    s, m = report["settings"], report["machine"]
    sims = report["sim"]
    live, runs, noise = report["live"]["summary"], report["live"]["runs"], report["live"]["spread"]
    keys = [k for k, _ in COMPARED if k in live]
    extra = {f"run {i + 1}": [f"{r[k]:.4g}" for k in keys] for i, r in enumerate(runs)}
    extra["live spread"] = [f"{100 * noise[k]:.1f}%" for k in keys]
    lines = [
        "# Simulator fidelity",
        "",
        f"One CPU engine (`{MODEL}` without EOS, FCFS, max batch {s['max_batch']}, max prefill tokens "
        f"{s['max_prefill_tokens']}, {s['threads']} torch thread) behind the control plane `llmfleet up` "
        f"starts; {s['requests']} Poisson requests at {s['rate_rps']} req/s (seed {s['seed']}), prompts "
        f"{s['prompt_min']}-{s['prompt_max']} tokens, outputs {s['output_min']}-{s['output_max']} tokens, "
        "submitted with `AsyncClient` at the planned times and timed on the client. The identical workload "
        f"ran {s['live_runs']}x through the cluster ('live' = mean of the runs). Machine: {m['cpus']} CPUs "
        f"shared with other users, load average {m['loadavg_before'][0]:.2f} before / "
        f"{m['loadavg_after'][0]:.2f} after. Goal: |diff| <= {GOAL:.0%} on mean latency, p99 latency and "
        "throughput.",
        "",
        *_table("live", live, sims, extra),
        "",
        "diff = (sim − live) / live. live spread = (max − min) / mean over the live runs of the identical "
        "workload: the machine's noise floor at the time.",
        "",
    ]
    for v, x in sims.items():
        worst = max(abs(rel_diff(x["summary"][k], live[k])) for k in HEADLINE)
        lines.append(
            f"- sim ({VARIANTS[v]}): mean latency, p99 latency and throughput within {GOAL:.0%}: "
            f"**{'yes' if worst <= GOAL else 'no'}** (worst {100 * worst:.1f}%)"
        )
    return lines


def _other_clocks(report: dict[str, Any]) -> list[str]:
    """The same runs timed by the scheduler, and the direct run timed by the engine and the client."""
    sims = report["sim"]
    lines = [
        "",
        "The same cluster runs timed by the scheduler (its Usage: arrival at the scheduler -> first / last "
        "token it relayed; without the client <-> scheduler hop):",
        "",
        *_table("live (scheduler)", report["live_scheduler_side"]["summary"], sims),
    ]
    direct = report.get("direct")
    if direct:
        lines += [
            "",
            "## Diagnostic: the workload straight to the engine",
            "",
            "The identical workload once more, sent straight to the engine's `Generate` (no scheduler, no "
            "SDK), between the cluster runs. Timed by the engine itself (its Usage: engine arrival -> first "
            "/ last token), which is what the simulator models, and on the client:",
            "",
            *_table("live (engine's clock)", direct["engine_side"], sims),
            "",
            *_table("live (client, direct)", direct["client_side"], sims),
        ]
    return lines


def _fit_lines(f: dict[str, Any]) -> list[str]:
    return [
        "",
        "## Cost model (fitted from the engine's Profile sweep)",
        "",
        f"- prefill t = k1*T + c1: k1 = {f['k1']:.3e} s/token, c1 = {f['c1'] * 1e3:.3f} ms "
        f"(max rel. error over the sweep's medians {f['reports']['aladdin.prefill']['max_rel_error']:.1%})",
        f"- decode t = (k2*l + c2)*b + c3: k2 = {f['k2']:.3e} s/token, c2 = {f['c2'] * 1e3:.3f} ms, "
        f"c3 = {f['c3'] * 1e3:.3f} ms (max rel. error {f['reports']['aladdin.decode']['max_rel_error']:.1%})",
    ]


def _calibration_lines(report: dict[str, Any]) -> list[str]:
    """The engine-side calibration groups and overheads, then the ones as deployed."""
    s = report["settings"]
    cal = report.get("calibration")
    if not cal:
        return []
    o = cal["overhead"]
    lines = [
        "",
        "## Calibration (engine-side, separate requests, before / between / after the live runs)",
        "",
        f"Groups of b identical requests ({s['calib_prompt']}-token prompt, {s['calib_output']} tokens out) "
        "sent together straight to the engine, one group at a time; live decode iteration = "
        "(latency − ttft)/(out − 1) from the engine's own Usage:",
        "",
        "| b | live iteration, each group (ms) | fitted t_d (ms) | mean excess (ms) |",
        "|---:|---|---:|---:|",
    ]
    for b in sorted({g["batch"] for g in cal["groups"]}):
        gb = [g for g in cal["groups"] if g["batch"] == b]
        excess = statistics.fmean(g["iteration_s"] - g["fitted_iteration_s"] for g in gb)
        lines.append(
            f"| {b} | {_ms(g['iteration_s'] for g in gb)} | {gb[0]['fitted_iteration_s'] * 1e3:.3f} | "
            f"{excess * 1e3:+.3f} |"
        )
    c = cal["record"]["aladdin"]
    lines += [
        "",
        f"Excess fitted as o3 + o2*b: o3 = {o['per_iteration_s'] * 1e3:.3f} ms per iteration (-> c3), "
        f"o2 = {o['per_sequence_s'] * 1e3:.3f} ms per sequence (-> c2); lone-request TTFT − t_pre: "
        f"o1 = {o['prefill_s'] * 1e3:.3f} ms (-> c1). Calibrated: c1 = {c['prefill']['c1'] * 1e3:.3f} ms, "
        f"c2 = {c['decode']['c2'] * 1e3:.3f} ms, c3 = {c['decode']['c3'] * 1e3:.3f} ms.",
    ]
    dep = cal.get("deployed")
    if dep:
        lines += _deployed_lines(dep)
    return lines


def _deployed_lines(dep: dict[str, Any]) -> list[str]:
    od, cd = dep["overhead"], dep["record"]["aladdin"]
    return [
        "",
        "## Calibration as deployed (the same groups through the SDK and the scheduler)",
        "",
        "The same groups sent through the cluster and timed on the client: the decode iteration "
        "while the control plane relays tokens on the same cores, and the hops.",
        "",
        "| b | live iteration through the cluster, each group (ms) |",
        "|---:|---|",
        *(
            f"| {b} | {_ms(g['iteration_s'] for g in dep['groups'] if g['batch'] == b)} |"
            for b in sorted({g["batch"] for g in dep["groups"]})
        ),
        "",
        f"o3 = {od['per_iteration_s'] * 1e3:.3f} ms, o2 = {od['per_sequence_s'] * 1e3:.3f} ms "
        f"(c2 = {cd['decode']['c2'] * 1e3:.3f} ms, c3 = {cd['decode']['c3'] * 1e3:.3f} ms); o1 from the "
        f"engine-side groups. Hop: lone requests' TTFT through the cluster − on the engine's clock = "
        f"{dep['hop_s'] * 1e3:.2f} ms, added to every simulated first token and finish (a constant delay "
        "shifts all arrivals at the engine alike, so the engine's schedule does not change).",
    ]


def _diagnostics(report: dict[str, Any]) -> list[str]:
    t, sims = report["timings"], report["sim"]
    d = report["diagnostics"]
    return [
        "",
        "## Diagnostics",
        "",
        f"- client − scheduler latency: {d['client_minus_scheduler_latency_mean_s'] * 1e3:.2f} ms per request "
        "on average (the client <-> scheduler hop)",
        f"- client send lag behind the plan: mean {d['send_lag_mean_s'] * 1e3:.2f} ms, max "
        f"{d['send_lag_max_s'] * 1e3:.2f} ms",
        f"- prompt lengths as planned (engine's count): {d['prompt_lengths_match']}/{d['requests_total']}; "
        f"outputs as planned: {d['output_lengths_match']}/{d['requests_total']}",
        f"- scheduler flags added: {' '.join(report['scheduler_flags']) or 'none'}",
        *little_lines(report),
        "- simulated engine: "
        + "; ".join(
            f"{VARIANTS[v]}: {x['iterations']} iterations, {x['mean_batch']:.2f} tokens per iteration, "
            f"busy {x['utilization']:.0%}"
            for v, x in sims.items()
        ),
        "",
        f"Runtime: {report['runtime_s']:.1f} s wall (cluster start {t['cluster_start_s']:.1f} s, profile "
        f"{t['profile_s']:.1f} s, calibration {t['calibration_s']:.1f} s, live runs {t['live_s']:.1f} s, "
        f"direct run {t['direct_s']:.1f} s, simulations {t['sim_s']:.2f} s, shutdown {t['shutdown_s']:.1f} s).",
        "",
    ]


def write_report(out: Path, report: dict[str, Any]) -> str:
    """``sim_fidelity.json`` and ``sim_fidelity.md`` under ``out``; returns the markdown."""
    (out / "sim_fidelity.json").write_text(json.dumps(report, indent=2) + "\n")
    md = render_markdown(report)
    (out / "sim_fidelity.md").write_text(md)
    return md
