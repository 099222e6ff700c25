"""The live control plane on emulated GPUs at fleet size (``make bench-fleet``): .bench/fleet/.

Sections (``--only``):

* ``startup`` — ``llmfleet up --emulate {N}xA100-80GB --emulate-processes K`` (N = 64, K = 4; ``--quick``:
  16, 2): seconds from launch until every emulated GPU is registered in etcd and the first plan is
  loaded, and the resident memory of every process of the cluster (etcd, schedulers, profiler,
  placement, migration, the engine hosts), summed. Goal: ≤ 6 GiB and ≤ 60 s at 64 GPUs. Then the
  same figures for ``llmfleet up --emulate {N}xA100-80GB`` on the default config
  (deploy/local/cluster.yaml: tiny models, so millions of KV blocks per 80 GB GPU, in one host process,
  prefix caching on). Goal: ≤ 3 GiB at 64 GPUs.
* ``replay`` — the conv trace (``--trace``, default ../shared/traces/azure_llm_2023_conv.csv) at the
  docs/simulator.md's rate (4×) for 10 minutes (``--quick``: 2) on 32 emulated A100s (quick 16), once per preset
  (``--preset``, default ``vllm-v0.4`` and ``seallm``; seallm places with Algorithm 1, the ``seallm``
  planner): ``llmfleet load --trace`` against the live fleet and ``llmfleet sim`` on the same trace window
  and services (``--first-plan cold``: the simulated leader starts as the live one, with no request
  seen), compared by ``llmfleet compare`` (mean and p99 latency, GPUs in use, placement plans,
  failures). Needs the trace; skipped without it.

Each figure comes from one run on this machine; the machine is named in the report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import psutil
import yaml
from llmfleet.engine_core import EngineLimits
from llmfleet.sim.run import preset
from llmfleet.spec.engines import EmulatedPool

from tools.bench.fleet_common import Fleet, FleetSpec, compare, run_load, run_sim, wait_until
from tools.bench.fleet_sections import bench_capacity, bench_mell, bench_scaling
from tools.bench.local_up import LocalUp

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"
DEFAULT_CONFIG = ROOT / "deploy" / "local" / "cluster.yaml"  # what ``llmfleet up`` runs without -c


SECTIONS = ("startup", "replay", "scaling", "mell", "capacity")


def bench_startup(out: Path, gpus: int, processes: int) -> dict:
    """The conv services' 7B–13B models on ``gpus`` emulated A100s in ``processes`` host processes."""
    placement = {"policy": "aladdin", "interval_s": 5, "window_s": 10, "confirm_intervals": 1}
    fleet = Fleet(out / f"fleet-{gpus}", FleetSpec(gpus, placement, processes=processes))
    run = startup_run(fleet, gpus, models=3)
    return {
        **run,
        "processes": processes,
        "goal": "<= 6 GiB and <= 60 s at 64 GPUs",
        "met": run["rss_total_gib"] <= 6 and run["registered_s"] <= 60 if gpus >= 64 else None,
    }


def bench_startup_default(out: Path, gpus: int) -> dict:
    """``llmfleet up --emulate {gpus}xA100-80GB`` on the default config: its tiny models on 80 GB GPUs
    give each GPU millions of KV blocks, in the config's one host process, prefix caching on."""
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    pool = EmulatedPool.model_validate(config.get("emulated") or {})
    up = LocalUp(out / f"default-{gpus}", config, "--emulate", f"{gpus}xA100-80GB")
    run = startup_run(up, gpus, models=len(config["models"]))
    return {
        **run,
        "config": str(DEFAULT_CONFIG.relative_to(ROOT)),
        "prefix_caching": EngineLimits(**pool.engine.limits()).prefix_caching,
        "goal": "<= 3 GiB at 64 GPUs, prefix caching on",
        "met": run["rss_total_gib"] <= 3 if gpus >= 64 else None,
    }


def startup_run(up: LocalUp, gpus: int, models: int) -> dict:
    """Start ``up``; seconds until healthy, every GPU registered and a plan placing ``models`` models
    loaded; then, settled, the resident memory of every process of the cluster."""
    t0 = up.start()
    try:
        healthy_s = time.monotonic() - t0
        wait_until(lambda: up.engines() >= gpus, 600, f"{gpus} engines registered")
        registered_s = time.monotonic() - t0
        wait_until(lambda: up.status().get("fleet", {}).get("gpus_in_use", 0) >= models, 600, "a plan")
        placed_s = time.monotonic() - t0
        time.sleep(5)  # settled: the engines' watches and leases running
        rss = up.rss_bytes()
    finally:
        up.stop()
    total = sum(rss.values())
    return {
        "gpus": gpus,
        "healthy_s": round(healthy_s, 2),
        "registered_s": round(registered_s, 2),
        "placed_s": round(placed_s, 2),
        "rss_total_gib": round(total / 2**30, 3),
        "rss_by_process_mib": {k: round(v / 2**20, 1) for k, v in sorted(rss.items())},
    }


def preset_config(name: str, placement: str | None) -> tuple[dict, dict, str]:
    """The live settings of ``llmfleet sim``'s preset ``name``: (placement section, emulated engine
    section, services' dispatch). ``placement`` overrides the preset's planner, on both sides."""

    b = preset(name, placement=placement)
    section = {"policy": b.placement.policy, "interval_s": 30, "window_s": 60, "confirm_intervals": 1}
    if b.placement.options:
        section["options"] = b.placement.options
    engine = {"policy": b.engine.policy, **({"options": b.engine.options} if b.engine.options else {})}
    return section, engine, b.dispatch.policy


def bench_replay(
    out: Path, gpus: int, trace: Path, rate_scale: float, duration_s: float, name: str, placement: str | None
) -> dict:
    """Live replay vs ``llmfleet sim`` on the same trace window and services (``llmfleet compare``):
    preset ``name`` (its placement planning every 30 s over the last 60 s, its dispatch and engine
    policy) on both sides, each starting as a live leader does (``--first-plan cold``)."""
    section, engine, dispatch = preset_config(name, placement)
    spec = FleetSpec(gpus, section, engine=engine, dispatch=dispatch)
    fleet = Fleet(out / f"{name}+{section['policy']}", spec)
    # duration_s of wall time: that much of the trace's time times the rate scale
    window = ["--trace", str(trace), "--rate-scale", str(rate_scale), "--end", str(duration_s * rate_scale)]
    fleet.start()
    try:
        load = run_load(fleet, window, fleet.dir / "live", duration_s * 3 + 600)
        pacing = fleet.emulated_pacing()
    finally:
        fleet.stop()
    sim_rc = run_sim(spec, fleet.config, window, name, fleet.dir / "sim", [])
    cmp = compare(fleet.dir / "sim", fleet.dir / "live", fleet.dir / "compare")
    rows = cmp.get("rows", {})

    def rel(fig: str) -> float | None:
        return (rows.get(fig) or {}).get("rel")

    def diff(fig: str) -> float | None:
        r = rows.get(fig) or {}
        return None if r.get("sim") is None or r.get("live") is None else r["live"] - r["sim"]

    goals = {
        "mean latency within 10%": _within(rel("latency mean s"), 0.10),
        "mean TPOT within 10%": _within(rel("TPOT (ATGT) mean s"), 0.10),
        "p99 latency within 15%": _within(rel("latency p99 s"), 0.15),
        "mean GPUs within 1": _within(diff("GPUs in use mean"), 1.0),
        "peak GPUs within 1": _within(diff("GPUs in use peak"), 1.0),
        "same placement plans": cmp.get("same_plans"),
        "0 failed": (rows.get("failed") or {}).get("live") == 0,
    }
    return {
        "gpus": gpus,
        "preset": name,
        "placement": section["policy"],
        "rate_scale": rate_scale,
        "duration_s": duration_s,
        "cost_source": spec.cost_source,
        "pacing": pacing,
        "load_rc": load.returncode,
        "sim_rc": sim_rc,
        "rows": rows,
        "plans": cmp.get("plans"),
        "goals": goals,
        "compare": cmp["text"],
        "dir": str(fleet.dir),
    }


def _within(v: float | None, tol: float) -> bool | None:
    return None if v is None else abs(v) <= tol


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".bench/fleet")
    ap.add_argument("--quick", action="store_true", help="16 GPUs in 2 processes; a 2-minute replay")
    ap.add_argument(
        "--only", choices=SECTIONS, action="append", help="sections to run (repeatable; default all)"
    )
    ap.add_argument("--gpus", type=int, default=None, help="startup: emulated GPUs (64; quick 16)")
    ap.add_argument("--processes", type=int, default=None, help="startup: engine processes (4; quick 2)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument(
        "--rate-scale", type=float, default=4.0, help="replay: the trace's rate × (docs/simulator.md's 4)"
    )
    ap.add_argument(
        "--preset",
        action="append",
        help="replay: llmfleet sim presets, live and simulated (vllm-v0.4 and seallm)",
    )
    ap.add_argument(
        "--placement", help="replay: override the presets' placement (default: seallm's is Algorithm 1)"
    )
    ap.add_argument("--duration", type=float, default=None, help="replay seconds (600; quick 120)")
    ap.add_argument("--capacity-gpus", type=int, default=256, help="capacity: emulated GPUs (256)")
    ap.add_argument(
        "--capacity-past", type=int, default=0, help="capacity: steps to run past the first one over 2x (0)"
    )
    ap.add_argument(
        "--capacity-rates", type=float, nargs="+", default=None, help="capacity: offered rates (4 8 ... 256)"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # --only updates those sections of an earlier report in --out and keeps the others
    previous = out / "fleet.json"
    report: dict = json.loads(previous.read_text()) if previous.exists() else {}
    report["machine"] = (
        f"{platform.node()} {os.cpu_count()} cores {psutil.virtual_memory().total / 2**30:.0f} GiB"
    )
    only = set(args.only or SECTIONS)
    lengths = args.trace if args.trace.exists() else None
    if "startup" in only:
        gpus = args.gpus or (16 if args.quick else 64)
        procs = args.processes or (2 if args.quick else 4)
        report["startup"] = bench_startup(out, gpus, procs)
        report["startup_default"] = bench_startup_default(out, gpus)
        print(json.dumps({k: report[k] for k in ("startup", "startup_default")}, indent=1))
        save(out, report)
    if "replay" in only:
        if not args.trace.exists():
            report["replay"] = {"skipped": f"no trace at {args.trace}"}
        else:
            report["replay"] = [
                bench_replay(
                    out,
                    args.gpus or (16 if args.quick else 32),
                    args.trace,
                    args.rate_scale,
                    args.duration or (120 if args.quick else 600),
                    name,
                    args.placement or ("seallm" if name == "seallm" else None),
                )
                for name in args.preset or ["vllm-v0.4", "seallm"]
            ]
        print(json.dumps(report["replay"], indent=1))
        save(out, report)
    if "scaling" in only:
        report["scaling"] = bench_scaling(out, lengths, args.quick)
        print(json.dumps({k: v for k, v in report["scaling"].items() if k != "compare"}, indent=1))
        save(out, report)
    if "mell" in only:
        if not args.trace.exists():
            report["mell"] = {"skipped": f"no trace at {args.trace}"}
        else:
            report["mell"] = bench_mell(out, args.trace, args.quick)
        print(json.dumps({k: v for k, v in report["mell"].items() if k != "compare"}, indent=1))
        save(out, report)
    if "capacity" in only:
        rates = tuple(args.capacity_rates) if args.capacity_rates else None
        report["capacity"] = bench_capacity(
            out, lengths, args.quick, args.capacity_gpus, rates, args.capacity_past
        )
        print(json.dumps(report["capacity"], indent=1))
    save(out, report)
    return 0


def save(out: Path, report: dict) -> None:
    """fleet.json, fleet.md and the plots, after every section (a later failure keeps the earlier ones)."""
    (out / "fleet.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "fleet.md").write_text(markdown(report))
    plot(report, out)


def markdown(report: dict) -> str:
    lines = ["# Emulated fleet (`make bench-fleet`)", "", f"Machine: {report['machine']}", ""]
    s = report.get("startup")
    if s:
        title = f"{s['gpus']} emulated A100-80GB (7B–13B models) in {s['processes']} processes"
        lines += _startup_lines(title, s)
    d = report.get("startup_default")
    if d:
        lines += _startup_lines(f"`llmfleet up --emulate {d['gpus']}xA100-80GB` on {d['config']}", d)
    r = report.get("replay")
    for run in r if isinstance(r, list) else [r] if r else []:
        title = (
            f"{run.get('preset')} (placement {run.get('placement')}) on {run.get('gpus')} emulated A100-80GB"
        )
        pacing = run.get("pacing") or {}
        per_step = pacing.get("host_per_step_ms")
        lines += [
            f"## Replay: live vs simulated, {title}",
            "",
            f"Rate × {run.get('rate_scale')}, {run.get('duration_s')} s, cost source {run.get('cost_source')}.",
            "",
            *_goals(run),
            *(
                [
                    f"Emulated pacing: {pacing['waits']:.0f} waits, {pacing['late']:.0f} late "
                    f"({pacing['lag_seconds']:.1f} s summed); the host's time from a step's due time to "
                    f"the next step: {per_step:.2f} ms per step over {pacing['host_steps']:.0f} steps "
                    f"(max {1e3 * pacing['host_max_s']:.1f} ms).",
                    "",
                ]
                if per_step is not None
                else []
            ),
            "```",
            run.get("compare", run.get("skipped", "")),
            "```",
            "",
        ]
    sc = report.get("scaling")
    if sc:
        lines += [
            f"## Aladdin scaling on a 4× rate step ({sc['gpus']} emulated A100-80GB, phases {sc['phases']})", "",
            *_goals(sc),
            f"Live GPUs matched a simulated count within ±{sc['interval_s']} s in {sc['follow']['within']} of "
            f"{sc['follow']['seconds']} seconds (worst miss {sc['follow']['worst_gpus_off']} GPUs); "
            f"failed {sc['failed']}. Plot: scaling.png", "", "```", sc["compare"], "```", "",
        ]  # fmt: skip
    m = report.get("mell")
    if m and "skipped" not in m:
        lines += [
            f"## Mell on {m['gpus']} emulated {m['hardware']}", "", *_goals(m),
            f"Peak active GPUs sim/live: {m['peak_active_gpus']}; mean {m['mean_active_gpus']}; "
            f"migrations {m['migrations']}", "", "```", m["compare"], "```", "",
        ]  # fmt: skip
    c = report.get("capacity")
    if c:
        lines += [
            f"## Capacity: {c['gpus']} emulated A100-80GB in {c['processes']} host processes (up in {c['up_s']} s)", "",
            "| offered req/s | completed | failed | TTFT p50 live s | TTFT p50 sim s | live/sim | busiest process (cores) |",
            "|---:|---:|---:|---:|---:|---:|---|",
        ]  # fmt: skip
        for st in c["steps"]:
            t = st["ttft_p50_s"]
            lines.append(
                f"| {st['rate_rps']:g} | {st['completed']} | {st['failed']} | {_f(t['live'])} | {_f(t['sim'])} | "
                f"{st['ttft_ratio']} | {st['busiest']['process']} ({st['busiest']['cores']}) |"
            )
        lines += [
            "",
            f"Sustained (live TTFT p50 ≤ 2× the simulator's): {c['sustained_rps']} req/s; first step over: "
            f"{c['first_over_2x']}; saturates first: {c['saturates_first']}. Plot: capacity.png",
            "",
        ]
    return "\n".join(lines)


def _startup_lines(title: str, s: dict) -> list[str]:
    """One start-up run: its times, its memory by process and its goal."""
    return [
        f"## Start-up: {title} + the control plane", "",
        "| figure | value |", "|---|---|",
        f"| healthy (every process answers) | {s['healthy_s']} s |",
        f"| every GPU registered in etcd | {s['registered_s']} s |",
        f"| first plan loaded | {s['placed_s']} s |",
        f"| resident memory, all processes | {s['rss_total_gib']} GiB |",
        *(f"| resident memory, {name} | {mib} MiB |" for name, mib in s["rss_by_process_mib"].items()),
        f"| goal | {s['goal']}: {s['met']} |", "",
    ]  # fmt: skip


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def _goals(run: dict) -> list[str]:
    goals = run.get("goals") or {}
    return [*(f"- {k}: **{v}**" for k, v in goals.items()), ""] if goals else []


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for key, name in (("startup", "rss.png"), ("startup_default", "rss_default.png")):
        s = report.get(key)
        if s:
            _rss_plot(plt, s, out / name)
    sc = report.get("scaling")
    if sc:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for name, series in sc["gpus_in_use"].items():
            if series:
                ts, ns = zip(*series, strict=True)
                ax.step([*ts, sum(p[1] for p in sc["phases"])], [*ns, ns[-1]], where="post", label=name)
        t = 0.0
        for rate, secs in sc["phases"]:
            ax.axvspan(t, t + secs, alpha=0.08 if rate == sc["phases"][0][0] else 0.2, color="gray")
            t += secs
        ax.set_xlabel("s")
        ax.set_ylabel("GPUs in use")
        ax.set_title("Aladdin on a 4× rate step (shaded: the 4× phase)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "scaling.png", dpi=110)
        plt.close(fig)
    c = report.get("capacity")
    if c and c["steps"]:
        rates = [st["rate_rps"] for st in c["steps"]]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        for side in ("live", "sim"):
            a1.plot(rates, [st["ttft_p50_s"][side] or float("nan") for st in c["steps"]], "o-", label=side)
        a1.set_xscale("log", base=2)
        a1.set_yscale("log")
        a1.set_xlabel("offered req/s")
        a1.set_ylabel("TTFT p50 (s)")
        a1.legend()
        procs = sorted(
            {p for st in c["steps"] for p in st["cpu_cores"]},
            key=lambda p: -c["steps"][-1]["cpu_cores"].get(p, 0),
        )[:6]
        for p in procs:
            a2.plot(rates, [st["cpu_cores"].get(p, 0) for st in c["steps"]], "o-", label=p)
        a2.set_xscale("log", base=2)
        a2.set_xlabel("offered req/s")
        a2.set_ylabel("CPU (cores)")
        a2.legend(fontsize=8)
        fig.suptitle(f"{c['gpus']} emulated GPUs: TTFT and CPU by process vs offered load")
        fig.tight_layout()
        fig.savefig(out / "capacity.png", dpi=110)
        plt.close(fig)


def _rss_plot(plt, s: dict, path: Path) -> None:
    names = list(s["rss_by_process_mib"])
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.5))
    ax.barh([n[:60] for n in names], [s["rss_by_process_mib"][n] for n in names])
    ax.set_xlabel("resident memory (MiB)")
    ax.set_title(f"{s['gpus']} emulated GPUs + control plane: {s['rss_total_gib']} GiB")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
