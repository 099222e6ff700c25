"""The fleet-scale live runs of ``make bench-fleet`` beside the start-up and replay sections:

* ``scaling`` — Aladdin scaling (``aladdin-scaling``: Eq. 6–7 worker count, JSQ, FCFS, planning every
  10 s over 10 s) on 16 emulated A100-80GB serving ``chat`` (Llama-2-7B), on a 4× rate step: the conv
  trace's own rate (4 req/s) for 90 s, docs/simulator.md's 4× (16 req/s) for 120 s, back to 4 req/s for 120 s
  (``--quick``: 45/60/60 s). Lengths are drawn from the conv trace (``step_trace``). Goal: live GPUs
  follow the simulator's count within one planning interval, and no request is lost while the pool
  scales in.
* ``mell`` — Mell (``dispatch: mell`` + ``migration: {policy: mell}``) on 16 emulated A100-40GB
  serving ``chat``, GPUs split evenly (``dedicated_even``), the conv trace at 4× for 5 minutes (quick 2).
  Goal: live peak GPUs within 1 of the simulator's, every move completes.
* ``capacity`` — 256 emulated A100-80GB (16 host processes) serving the conv trace's three services on
  an even split, with the offered rate stepped (4, 8, 16, 32, 64, ... req/s, 60 s a step; quick 30 s) until
  the live TTFT p50 exceeds 2× the simulator's at the same rate. Reported per step: live and
  simulated TTFT p50, completed and failed requests, and each process's CPU use (cores), so the
  process that saturates first is named.

Each compares ``llmfleet load`` against ``llmfleet sim`` on the same trace (``fleet_common``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tools.bench.fleet_common import Fleet, FleetSpec, compare, follows, gpu_series, run_load, run_sim
from tools.bench.step_trace import write_step_trace

CHAT = {"chat": {"model": "llama2-7b", "slo": {"ttft_s": 2.0, "tpot_s": 0.1}}}


def _report_run(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    return doc["runs"][0] if "runs" in doc else doc


def bench_scaling(out: Path, lengths_from: Path | None, quick: bool) -> dict:
    base, interval = 4.0, 10
    phases = (
        [(base, 45.0), (4 * base, 60.0), (base, 60.0)]
        if quick
        else [(base, 90.0), (4 * base, 120.0), (base, 120.0)]
    )
    placement = {"policy": "aladdin", "interval_s": interval, "window_s": 10, "confirm_intervals": 1}
    spec = FleetSpec(16, placement, services=dict(CHAT), dispatch="jsq", engine={"policy": "fcfs"})
    fleet = Fleet(out / "scaling", spec)
    trace = fleet.dir / "step.csv"
    n = write_step_trace(trace, phases, lengths_from)
    window = ["--trace", str(trace)]
    fleet.start()
    try:
        load = run_load(fleet, window, fleet.dir / "live", sum(s for _, s in phases) * 3 + 600)
    finally:
        fleet.stop()
    sim_rc = run_sim(spec, fleet.config, window, "aladdin-scaling", fleet.dir / "sim", [])
    cmp = compare(fleet.dir / "sim", fleet.dir / "live", fleet.dir / "compare")
    sim_s, live_s = (
        gpu_series(fleet.dir / "sim" / "report.json"),
        gpu_series(fleet.dir / "live" / "report.json"),
    )
    end = sum(s for _, s in phases)
    follow = follows(sim_s, live_s, interval, end)
    live = _report_run(fleet.dir / "live" / "report.json")
    scale_in_at = phases[0][1] + phases[1][1]
    return {
        "gpus": 16,
        "phases": phases,
        "requests": n,
        "interval_s": interval,
        "load_rc": load.returncode,
        "sim_rc": sim_rc,
        "gpus_in_use": {"sim": sim_s, "live": live_s},
        "follow": follow,
        "failed": (cmp.get("rows", {}).get("failed") or {}).get("live"),
        "errors": (live.get("live") or {}).get("errors"),
        "scale_in_from_s": scale_in_at,
        "rows": cmp.get("rows"),
        "compare": cmp["text"],
        "goals": {
            "GPUs follow the simulator's within one interval (share of seconds)": follow["share"],
            "0 lost while scaling in": (cmp.get("rows", {}).get("failed") or {}).get("live") == 0,
        },
        "dir": str(fleet.dir),
    }


def bench_mell(out: Path, trace: Path, quick: bool) -> dict:
    duration = 120.0 if quick else 300.0
    placement = {"policy": "dedicated_even", "interval_s": 30, "window_s": 60, "confirm_intervals": 1}
    spec = FleetSpec(
        16, placement, hardware="A100-40GB", services=dict(CHAT), dispatch="mell", engine={"policy": "fcfs"},
        migration={"policy": "mell", "epoch_s": 1},
    )  # fmt: skip
    fleet = Fleet(out / "mell", spec)
    window = ["--trace", str(trace), "--rate-scale", "4", "--end", str(duration * 4)]
    fleet.start()
    try:
        load = run_load(fleet, window, fleet.dir / "live", duration * 3 + 600)
    finally:
        fleet.stop()
    sim_rc = run_sim(
        spec, fleet.config, window, "fcfs-jsq", fleet.dir / "sim",
        ["--dispatch", "mell", "--migration", "mell", "--migration-epoch-s", "1"],
    )  # fmt: skip
    cmp = compare(fleet.dir / "sim", fleet.dir / "live", fleet.dir / "compare")
    sim, live = (
        _report_run(fleet.dir / "sim" / "report.json"),
        _report_run(fleet.dir / "live" / "report.json"),
    )
    peak = {"sim": _peak_active(sim), "live": _peak_active(live)}
    mig = live.get("migration") or {}
    return {
        "gpus": 16,
        "hardware": "A100-40GB",
        "duration_s": duration,
        "load_rc": load.returncode,
        "sim_rc": sim_rc,
        "peak_active_gpus": peak,
        "mean_active_gpus": {
            "sim": (sim.get("cluster") or {}).get("mean_active_gpus"),
            "live": (live.get("cluster") or {}).get("mean_active_gpus"),
        },
        "migrations": {
            "sim": (sim.get("migration") or {}).get("executed"),
            "live": {k: mig.get(k) for k in ("executed", "failed", "aborted", "started") if k in mig},
        },
        "rows": cmp.get("rows"),
        "compare": cmp["text"],
        "goals": {
            "live peak GPUs within 1 of the simulator's": None
            if None in peak.values()
            else abs(peak["live"] - peak["sim"]) <= 1,
            "every move completes": not mig.get("failed") and not mig.get("aborted"),
        },
        "dir": str(fleet.dir),
    }


def _peak_active(run: dict) -> int | None:
    cl = run.get("cluster") or {}
    if cl.get("peak_active_gpus") is not None:
        return int(cl["peak_active_gpus"])
    series = cl.get("active_gpus") or []
    return int(max(n for _, n in series)) if series else None


def bench_capacity(
    out: Path,
    lengths_from: Path | None,
    quick: bool,
    gpus: int = 256,
    rates: tuple[float, ...] | None = None,
    past: int = 0,
) -> dict:
    """``past``: steps to run after the first one over 2× (to see where the live side saturates)."""
    step_s = 30.0 if quick else 60.0
    rates = rates or (4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)
    placement = {"policy": "dedicated_even", "interval_s": 600, "window_s": 60, "confirm_intervals": 1}
    spec = FleetSpec(gpus, placement, dispatch="jsq", engine={"policy": "fcfs"})
    fleet = Fleet(out / f"capacity-{gpus}", spec)
    t0 = fleet.start(timeout_s=900)
    steps: list[dict] = []
    try:
        up_s = time.monotonic() - t0
        for rate in rates:
            d = fleet.dir / f"rate-{rate:g}"
            trace = d / "trace.csv"
            n = write_step_trace(trace, [(rate, step_s)], lengths_from, seed=int(rate))
            cpu0, w0 = fleet.cpu_seconds(), time.monotonic()
            load = run_load(fleet, ["--trace", str(trace)], d / "live", step_s * 4 + 600)
            cpu1, wall = fleet.cpu_seconds(), time.monotonic() - w0
            cores = {k: round((cpu1[k] - cpu0.get(k, 0.0)) / wall, 3) for k in cpu1}
            run_sim(spec, fleet.config, ["--trace", str(trace)], "fcfs-jsq", d / "sim", [])
            live, sim = _report_run(d / "live" / "report.json"), _report_run(d / "sim" / "report.json")
            ttft = {
                "live": (live.get("overall") or {}).get("ttft_s", {}).get("p50"),
                "sim": (sim.get("overall") or {}).get("ttft_s", {}).get("p50"),
            }
            busiest = max(cores.items(), key=lambda kv: kv[1]) if cores else ("", 0.0)
            step = {
                "rate_rps": rate,
                "requests": n,
                "load_rc": load.returncode,
                "completed": (live.get("overall") or {}).get("completed"),
                "failed": (live.get("overall") or {}).get("failed"),
                "ttft_p50_s": ttft,
                "ttft_ratio": None
                if not ttft["sim"] or ttft["live"] is None
                else round(ttft["live"] / ttft["sim"], 2),
                "cpu_cores": dict(sorted(cores.items(), key=lambda kv: -kv[1])),
                "busiest": {"process": busiest[0], "cores": busiest[1]},
                "wall_s": round(wall, 1),
            }
            steps.append(step)
            print(
                json.dumps({k: step[k] for k in ("rate_rps", "ttft_p50_s", "ttft_ratio", "busiest")}),
                flush=True,
            )
            over = [x for x in steps if x["ttft_ratio"] is None or x["ttft_ratio"] > 2.0]
            if over and len(steps) - steps.index(over[0]) > past:
                break
    finally:
        fleet.stop()
    sustained = [s["rate_rps"] for s in steps if s["ttft_ratio"] is not None and s["ttft_ratio"] <= 2.0]
    over = next((s for s in steps if s["ttft_ratio"] is None or s["ttft_ratio"] > 2.0), None)
    return {
        "gpus": gpus,
        "processes": spec.host_processes,
        "up_s": round(up_s, 1),
        "step_s": step_s,
        "steps": steps,
        "sustained_rps": max(sustained) if sustained else None,
        "first_over_2x": over["rate_rps"] if over else None,
        "saturates_first": over["busiest"] if over else (steps[-1]["busiest"] if steps else None),
        "dir": str(fleet.dir),
    }
