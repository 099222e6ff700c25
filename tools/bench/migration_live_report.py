"""The report of ``migration_live.py``: busy-engine statistics of a live or simulated run and
``live.md`` (live vs simulated per variant, checks, and what differs between the two)."""

from __future__ import annotations

import statistics
from typing import Any

from tools.bench.migration_live_cluster import EPOCH_S, POLL_S
from tools.bench.sim_fidelity.workload import HARDWARE


def step_stats(series: list[tuple[float, int]], start: float, end: float) -> tuple[int, float]:
    """Peak and time-weighted mean of a sampled step function over [start, end]."""
    pts = sorted(series)
    inside = [(t, v) for t, v in pts if start <= t <= end]
    before = [v for t, v in pts if t < start]
    if before:
        inside.insert(0, (start, before[-1]))
    if not inside:
        return 0, 0.0
    area = 0.0
    for i, (t, v) in enumerate(inside):
        t1 = inside[i + 1][0] if i + 1 < len(inside) else end
        area += v * max(0.0, t1 - t)
    span = end - inside[0][0]
    return max(v for _, v in inside), area / span if span > 0 else float(inside[-1][1])


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def summarize(rows: list[dict[str, Any]], series: list[tuple[float, int]], migrations: int, n: int) -> dict:
    ok = [r for r in rows if r.get("finish_s") is not None]
    lat = [r["finish_s"] - r["arrival_s"] for r in ok]
    start = min((r["arrival_s"] for r in rows), default=0.0)
    end = max((r["finish_s"] for r in ok), default=start)
    peak, mean = step_stats(series, start, end)
    return {
        "requests": n,
        "completed": len(ok),
        "peak_busy_engines": peak,
        "mean_busy_engines": mean,
        "migrations": migrations,
        "latency_p50_s": pct(lat, 50),
        "latency_p99_s": pct(lat, 99),
        "latency_mean_s": statistics.fmean(lat) if lat else None,
        "makespan_s": end - start,
    }


def fmt(x: Any, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def failed_why(v: dict[str, Any]) -> str:
    """The live failed moves' distinct errors, shortened."""
    errs = sorted(
        {(m.get("error") or "?")[:80] for m in v["live_migration_records"] if m["state"] == "failed"}
    )
    return f": {'; '.join(f'`{e}`' for e in errs[:3])}" if errs else ""


def markdown(res: dict[str, Any]) -> str:
    """``live.md``: the comparison table, one line of checks per variant, what differs, the wall time."""
    lines = _table(res)
    lines += ["", "Checks:"]
    lines += [_checks(name, v) for name, v in res["variants"].items()]
    lines += _differences(res)
    return "\n".join(lines) + "\n"


def _table(res: dict[str, Any]) -> list[str]:
    a = res["settings"]
    lines = [
        "# Mell migration: live beside its simulation",
        "",
        f"{a['requests']} requests, Poisson {a['rate']} req/s (seed {a['seed']}), {a['long_fraction']:.0%} long "
        f"({a['long']} output tokens), the rest {a['short_min']}–{a['short_max']} tokens; prompts 16–64 tokens. "
        f"3 CPU engines (tiny llama without EOS, FCFS, max running {a['max_batch']}, memory budget "
        f"{a['memory_budget']}: KV pool {res['engine']['kv_capacity_bytes'] / 2**20:.2f} MiB = "
        f"{res['engine']['kv_capacity_tokens']} tokens, a long request ends at "
        f"{a['long'] / res['engine']['kv_capacity_tokens']:.0%} of it); migration epoch {EPOCH_S} s. "
        f"Simulated on `3x{HARDWARE}` with the engines' pool and knobs and the {res['sim_record']} cost record "
        "from the engine's Profile sweep. (The endless llama's context is 2,048 tokens: a long request "
        "cannot grow much past 1,900 output tokens.)",
        "",
        "Busy engines = engines holding requests (running + waiting > 0); live as the migration leader "
        f"sees them (Status every {POLL_S} s, load reports every {POLL_S} s), simulated from the simulator's "
        "samples; peak and time-weighted mean over first arrival .. last finish.",
        "",
        "| variant | dispatch | migration | completed live / sim | peak busy live / sim | mean busy live / sim "
        "| migrations live / sim | p50 latency s live / sim | p99 latency s live / sim |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in res["variants"].items():
        lv, sm = v["live"], v["sim"]
        lines.append(
            f"| {name} | {v['dispatch']} | {v['migration']} | {lv['completed']}/{lv['requests']} / "
            f"{sm['completed']}/{sm['requests']} | {lv['peak_busy_engines']} / {sm['peak_busy_engines']} | "
            f"{fmt(lv['mean_busy_engines'])} / {fmt(sm['mean_busy_engines'])} | {lv['migrations']} / "
            f"{sm['migrations']} | {fmt(lv['latency_p50_s'])} / {fmt(sm['latency_p50_s'])} | "
            f"{fmt(lv['latency_p99_s'])} / {fmt(sm['latency_p99_s'])} |"
        )
    return lines


def _checks(name: str, v: dict[str, Any]) -> str:
    lv = v["live"]
    return (
        f"- {name}: {lv['completed']}/{lv['requests']} live requests completed, "
        f"{v['wrong_tokens']} with a token count other than max_tokens, {len(v['errors'])} errors; "
        f"live epochs {v['epochs']['count']} (moves executed {v['epochs']['executed']}, failed "
        f"{v['epochs']['failed']}{failed_why(v)}, deactivations {v['epochs']['deactivations']}); "
        f"mean latency live / sim {fmt(lv['latency_mean_s'])} / {fmt(v['sim']['latency_mean_s'])} s; "
        f"leader's active set peak / mean {v['live_active_set']['peak_busy_engines']} / "
        f"{fmt(v['live_active_set']['mean_busy_engines'])}; "
        f"sim preemptions {v['sim_preemptions']}; raw-fit sim: peak "
        f"{v['sim_raw']['peak_busy_engines']}, mean {fmt(v['sim_raw']['mean_busy_engines'])}, migrations "
        f"{v['sim_raw']['migrations']}, p99 {fmt(v['sim_raw']['latency_p99_s'])} s."
    )


# What differs between the live and the simulated runs (live.md)
DIFFERENCES = [
    f"- **Epoch timing.** The live leader ticks every {EPOCH_S} s on its own clock, unaligned with "
    "arrivals, and an epoch's moves run after its planning (Migrate RPCs, at most 4 at once); the "
    "simulator's epochs are exact and its moves take the modelled transfer time.",
    f"- **Load-report delay.** The live leader plans from engine load snapshots (every {POLL_S} s), so "
    "a request that just arrived or finished is seen late (or counted as waiting with its prompt's "
    "KV); the simulator sees the exact state. The live busy-engine series is also what the leader "
    "sees, sampled every 0.2 s, so short blips are missed or lengthened.",
    "- **Mell dispatch's view.** Live, the scheduler places arrivals on the leader's published "
    "state (`migration_state`, written when it changes), which lags; in the simulator dispatch "
    "reads the packer's current view.",
    "- **Cost model.** The CPU cost record is a linear Aladdin fit of one engine's Profile sweep "
    "(plus calibrated loop overheads); live, three engines, the control plane and the client share "
    "2 cores (and any other load on the machine), so iterations are slower and noisier when "
    "several engines are busy — which the simulator (instances independent) does not model. "
    "Latency differences come mostly from this.",
    "- **Failed live moves.** `NOT_FOUND: request ... is not on engine` is a move planned from a "
    "snapshot in which the request was still running but which finished before its `Migrate` "
    "arrived (the load-report delay again); the request completed on its source, nothing is lost. "
    "The simulator never plans a move for a finished request.",
    "- **Active set.** `live_active_set` in live.json is the leader's active set (engines receiving new "
    "requests) from Status; without a migration policy (`rr`) Status has no active set and reports "
    "the engines with running requests instead.",
    "- **Migration cost.** A live move pauses the request on its source, ships its KV (or tokens) over "
    "gRPC on the same host and resumes it; the simulator uses the catalog `cpu` link bandwidth.",
]


def _differences(res: dict[str, Any]) -> list[str]:
    wall = (
        f"Wall time {res['wall_s']:.0f} s (cluster start, profile and calibration included). Load average "
        f"before / after: {res['loadavg'][0][0]:.2f} / {res['loadavg'][1][0]:.2f}."
    )
    return ["", "## What differs between live and simulated", "", *DIFFERENCES, "", wall]
