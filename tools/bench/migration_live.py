"""Mell migration, live beside its simulation (``make bench-migration-live``): live.json + live.md.

The same small scenario runs on a live local cluster of three CPU engines and in the simulator:

1. **Live.** ``llmfleet.cli.local_cluster.start_local_cluster`` starts what ``llmfleet up`` plans for a
   cluster config with one service ``chat`` -> the tiny llama without EOS (every request generates
   exactly ``max_tokens``), three engines ``engine-0..2`` (FCFS, the sim_fidelity engine flags, a
   small ``--memory-budget`` so that a long request is a visible share of an engine's KV pool), the
   service's ``dispatch:`` and the cluster's ``migration: {policy, epoch_s: 0.5}`` section (passed to
   ``llmfleet-migration`` by the planner; ``load_interval_s: 0.2`` in the config's migration section, as in the
   integration test). Variants, one fresh cluster each:

   * ``mell``: ``dispatch: mell`` + Mell migration;
   * ``rr+mell``: ``dispatch: round_robin`` + Mell migration;
   * ``rr``: ``dispatch: round_robin``, migration ``none`` (the baseline).

   A seeded Poisson workload (``--rate`` req/s, ``--requests``), a ``--long-fraction`` of long requests
   (``--long`` output tokens) among short ones (``--short-min``..``--short-max``), is sent with
   ``llmfleet.client.AsyncClient`` at its planned times. Every 0.2 s the migration leader's
   ``Migration.Status`` is polled: the engines holding requests (running + waiting > 0, as reported to
   the leader), the engines in its active set, and the migrations finished (unique ids).
2. **Cost model.** On the first cluster, one engine's ``Profile`` sweep (``sim_fidelity.cluster.
   profile_engine``) -> ``fit_engine_profile`` -> ``record_from_fit``; then a short calibration
   (``sim_fidelity.calibrate.calibrate`` + ``fit_overhead`` + ``with_overhead``) adds the live loop's
   per-iteration overheads. Both records are simulated; the calibrated one is the headline.
3. **Simulation.** The identical requests (planned arrivals, engine-counted prompt lengths, output
   lengths) on ``3xcpu`` with the live engines' knobs and KV pool (``EngineSettings(kv_bytes=...)``,
   one instance per engine), ``PolicyBundle(dispatch=mell|round_robin, migration=mell|None,
   migration={epoch_s: 0.5})``.

Reported per variant: live vs simulated peak and time-averaged engines holding requests (over first
arrival .. last finish), migrations executed, p50/p99 latency, requests completed (every one must
complete with its planned token count).
"""

from __future__ import annotations

# The parts: migration_live_cluster (the live cluster, the requests, the leader's Status),
# migration_live_report (busy-engine statistics and live.md); this file plans the workload, simulates it
# and drives the runs.
import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llmfleet.costmodel import fit_engine_profile, record_from_fit
from llmfleet.policies.placement import InstancePlan
from llmfleet.sim.run import PolicyBundle
from llmfleet.sim.run import simulate as sim_run
from llmfleet.workload import poisson

from tools.bench.migration_live_cluster import (
    ENGINES,
    EPOCH_S,
    POLL_S,
    SERVICE,
    LeaderWatch,
    Planned,
    run_live,
    send_one,
    start,
    status,
    wait_ready,
)
from tools.bench.migration_live_report import failed_why, fmt, markdown, pct, step_stats, summarize
from tools.bench.sim_fidelity.calibrate import calibrate, fit_overhead, with_overhead
from tools.bench.sim_fidelity.cli import stderr_log
from tools.bench.sim_fidelity.cluster import profile_engine
from tools.bench.sim_fidelity.replay import replay_spec
from tools.bench.sim_fidelity.workload import HARDWARE, MODEL, Settings

__all__ = [
    "ENGINES",
    "EPOCH_S",
    "POLL_S",
    "SERVICE",
    "VARIANTS",
    "LeaderWatch",
    "Planned",
    "failed_why",
    "fmt",
    "main",
    "markdown",
    "parse_args",
    "pct",
    "plan_workload",
    "run_live",
    "send_one",
    "simulate",
    "start",
    "status",
    "step_stats",
    "summarize",
    "wait_ready",
]

VARIANTS: dict[str, tuple[str, str]] = {  # name -> (dispatch, migration policy)
    "mell": ("mell", "mell"),
    "rr+mell": ("round_robin", "mell"),
    "rr": ("round_robin", "none"),
}


def plan_workload(args: argparse.Namespace) -> list[Planned]:
    import numpy as np

    arrivals = poisson(args.rate, n=args.requests, seed=args.seed)
    rng = np.random.default_rng(args.seed + 1)
    out = []
    for i, a in enumerate(arrivals):
        long = bool(rng.random() < args.long_fraction)
        n = args.long if long else int(rng.integers(args.short_min, args.short_max + 1))
        out.append(Planned(f"r{i}", float(a), int(rng.integers(16, 65)), n, long))
    return out


# ----------------------------------------------------------------------------------------- simulation
def simulate(
    rows: list[dict[str, Any]], record: Any, s: Settings, kv: int, tpb: int, dispatch: str, policy: str
) -> dict[str, Any]:
    spec, wl = replay_spec(rows, s, kv, tpb, len(ENGINES), min(r["output_tokens"] for r in rows))
    bundle = PolicyBundle(
        f"live-{dispatch}-{policy}",
        placement="dedicated_even",
        dispatch=dispatch,
        engine="fcfs",
        migration={"policy": policy, "transfer": "hybrid", "epoch_s": EPOCH_S},
    )
    e = sim_run(
        spec,
        wl,
        bundle,
        records=[record],
        plan=[InstancePlan(eid, (MODEL,), 1) for eid in ENGINES],
        samples=2000,
    )
    recs = e.result.records
    mig = e.report.get("migration") or {}
    sim_rows = [
        {
            "request_id": r.request_id,
            "arrival_s": r.arrival_s,
            "finish_s": r.finish_s if r.done else None,
            "output_tokens": r.output_tokens,
        }
        for r in recs
    ]
    series = [(x.t, x.active_gpus) for x in e.result.samples]
    cl = e.report["cluster"]
    return {
        "rows": sim_rows,
        "series": series,
        "migrations": mig.get("executed", 0),
        "migration": {k: v for k, v in mig.items() if isinstance(v, (int, float))},
        "report_peak_active": cl["peak_active_gpus"],
        "report_mean_active": cl["mean_active_gpus"],
        "preemptions": e.report["overall"]["preemptions"],
    }


# ------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".bench/migration")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {sorted(VARIANTS)}")
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--rate", type=float, default=3.0, help="Poisson arrival rate (req/s)")
    ap.add_argument("--long", type=int, default=1900, help="long requests' output tokens")
    ap.add_argument("--long-fraction", type=float, default=0.3)
    ap.add_argument("--short-min", type=int, default=50)
    ap.add_argument("--short-max", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--memory-budget",
        default="9MiB",
        help="each engine's --memory-budget (sets its KV pool: ~3.7 MiB at 9MiB)",
    )
    ap.add_argument("--max-batch", type=int, default=32, help="engine --max-running = --max-batch-requests")
    ap.add_argument("--no-calibrate", action="store_true", help="simulate with the raw profile fit only")
    ap.add_argument("--keep", action="store_true", help="keep the clusters' state dirs (logs)")
    return ap.parse_args(argv)


def _settings(args: argparse.Namespace) -> Settings:
    """The engines' knobs and the profile / calibration sweeps of this benchmark."""
    return dataclasses.replace(
        Settings(),
        max_batch=args.max_batch,
        memory_budget=args.memory_budget,
        sweep_batches=(1, 2, 4, 8, 16),
        sweep_inputs=(16, 32, 64),
        sweep_contexts=(16, 256, 768, 1536),
        sweep_repeats=3,
        calib_rounds=1,
        calib_batches=(1, 2, 4, 8),
    )


@dataclasses.dataclass
class LiveMeasurement:
    """Every variant's live run, and the first cluster's engine info, profile and calibration groups."""

    live: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    info: Any = None
    samples: Any = None
    groups: Any = None


def _measure(
    args: argparse.Namespace, variants: list[str], planned: list[Planned], s: Settings, log: Any
) -> LiveMeasurement:
    """One fresh cluster per variant; the first one is also profiled and calibrated."""
    m = LiveMeasurement()
    base = Path(tempfile.mkdtemp(prefix="llmfleet-mell-live-"))
    models_dir = base / "models"
    try:
        for v in variants:
            dispatch, policy = VARIANTS[v]
            cluster = start(base / v, models_dir, s, dispatch, policy, log)
            try:
                got = asyncio.run(wait_ready(cluster))
                if m.info is None:
                    m.info = got
                    log(f"KV pool {m.info.kv_capacity_bytes} B per engine; profiling engine-0")
                    m.samples = asyncio.run(profile_engine(cluster.addresses[ENGINES[0]], s))
                    if not args.no_calibrate:
                        m.groups = asyncio.run(calibrate(cluster.addresses[ENGINES[0]], s, random.Random(99)))
                    log(f"profile: {len(m.samples)} samples, {len(m.groups or [])} calibration groups")
                log(f"live {v}: sending {len(planned)} requests")
                t = time.perf_counter()
                m.live[v] = asyncio.run(run_live(cluster, planned, args.seed))
                m.live[v]["wall_s"] = time.perf_counter() - t
                log(
                    f"live {v}: done in {m.live[v]['wall_s']:.1f} s, {len(m.live[v]['migrations'])} migrations"
                )
            finally:
                cluster.stop()
    finally:
        if args.keep:
            log(f"state and logs kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return m


def _records(m: LiveMeasurement) -> tuple[Any, Any, str, Any]:
    """(raw record, headline record, its name, the calibrated overhead or None) from the profile."""

    fit = fit_engine_profile(m.samples)
    raw = record_from_fit(fit, MODEL, HARDWARE, "native")
    record, record_name, overhead = raw, "raw", None
    if m.groups:
        o = fit_overhead(m.groups, raw.aladdin.prefill, raw.aladdin.decode)
        record, record_name, overhead = with_overhead(raw, o), "calibrated", o.to_dict()
    return raw, record, record_name, overhead


def _variant(
    v: str,
    lv: dict[str, Any],
    planned: list[Planned],
    recs: dict[str, Any],
    s: Settings,
    kv: int,
    tpb: int,
    log,
) -> dict[str, Any]:
    """One variant's entry: its live run summarized beside its simulations (raw and headline records)."""
    dispatch, policy = VARIANTS[v]
    n = len(planned)
    rows = lv["rows"]
    wrong = [r["request_id"] for r in rows if r["output_tokens"] != r["planned_output_tokens"]]
    if len(rows) == n:
        sim_in = rows
    else:  # failed live requests: simulate the planned ones anyway
        sim_in = [
            {"request_id": p.request_id, "planned_arrival_s": p.arrival_s,
             "prompt_tokens": p.prompt_tokens, "output_tokens": p.output_tokens}
            for p in planned
        ]  # fmt: skip
    t = time.perf_counter()
    sims = {k: simulate(sim_in, rec, s, kv, tpb, dispatch, policy) for k, rec in recs.items()}
    log(f"sim {v}: {time.perf_counter() - t:.1f} s")
    live_series = [(t_, b) for t_, b, _ in lv["series"]]
    live_done = sum(1 for m in lv["migrations"] if m["state"] == "done")
    entry = {
        "dispatch": dispatch,
        "migration": policy,
        "live": summarize(rows, live_series, live_done, n),
        "sim": summarize(
            sims["headline"]["rows"], sims["headline"]["series"], sims["headline"]["migrations"], n
        ),
        "sim_raw": summarize(sims["raw"]["rows"], sims["raw"]["series"], sims["raw"]["migrations"], n),
        "live_active_set": summarize(rows, [(t_, a) for t_, _, a in lv["series"]], live_done, n),
        "wrong_tokens": len(wrong),
        "wrong_token_ids": wrong[:10],
        "errors": lv["errors"][:10],
        "epochs": lv["epochs"],
        "live_migrations_failed": sum(1 for m in lv["migrations"] if m["state"] == "failed"),
        "live_wall_s": lv["wall_s"],
        "sim_migration": sims["headline"]["migration"],
        "sim_preemptions": sims["headline"]["preemptions"],
        "live_series": lv["series"],
        "sim_series": sims["headline"]["series"],
        "live_rows": rows,
        "live_migration_records": lv["migrations"],
    }
    L, S = entry["live"], entry["sim"]
    log(
        f"{v}: completed {L['completed']}/{n} (wrong tokens {len(wrong)}), peak busy {L['peak_busy_engines']} "
        f"/ {S['peak_busy_engines']}, mean {L['mean_busy_engines']:.2f} / {S['mean_busy_engines']:.2f}, "
        f"migrations {L['migrations']} / {S['migrations']}, p50 {fmt(L['latency_p50_s'])} / "
        f"{fmt(S['latency_p50_s'])} s, p99 {fmt(L['latency_p99_s'])} / {fmt(S['latency_p99_s'])} s"
    )
    return entry


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r}; valid: {sorted(VARIANTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    log = stderr_log(t_start)
    s = _settings(args)
    planned = plan_workload(args)
    log(f"{len(planned)} requests over {planned[-1].arrival_s:.1f} s, {sum(p.long for p in planned)} long")
    m = _measure(args, variants, planned, s, log)
    assert m.info is not None and m.samples is not None
    info = m.info
    model = next(x for x in info.models if x.name == MODEL)
    kv, tpb = info.kv_capacity_bytes, model.tokens_per_block
    per_token = info.kv_block_bytes / tpb if tpb else 0
    raw, record, record_name, overhead = _records(m)
    res: dict[str, Any] = {
        "settings": vars(args),
        "engine": {
            "kv_capacity_bytes": kv,
            "kv_block_bytes": info.kv_block_bytes,
            "tokens_per_block": tpb,
            "kv_capacity_tokens": int(kv / per_token) if per_token else 0,
        },
        "sim_record": record_name,
        "records": {"raw": raw.to_dict(), "calibrated": record.to_dict() if m.groups else None},
        "overhead": overhead,
        "variants": {},
    }
    n = len(planned)
    recs = {"raw": raw, "headline": record}
    for v in variants:
        res["variants"][v] = _variant(v, m.live[v], planned, recs, s, kv, tpb, log)
    res["loadavg"] = [load_before, os.getloadavg()]
    res["wall_s"] = time.perf_counter() - t_start
    (out / "live.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "live.md").write_text(markdown(res))
    print(markdown(res))
    bad = [v for v, e in res["variants"].items() if e["live"]["completed"] != n or e["wrong_tokens"]]
    if bad:
        log(f"NOT every request completed with its planned token count: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
