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
   migration_epoch_s=0.5)``.

Reported per variant: live vs simulated peak and time-averaged engines holding requests (over first
arrival .. last finish), migrations executed, p50/p99 latency, requests completed (every one must
complete with its planned token count).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from sim_fidelity.calibrate import calibrate, fit_overhead, with_overhead  # noqa: E402
from sim_fidelity.cluster import engine_flags, profile_engine, scheduler_flags  # noqa: E402
from sim_fidelity.replay import replay_spec  # noqa: E402
from sim_fidelity.workload import HARDWARE, MODEL, Settings, make_prompt  # noqa: E402

SERVICE = "chat"
ENGINES = [f"engine-{i}" for i in range(3)]
EPOCH_S = 0.5
POLL_S = 0.2
VARIANTS: dict[str, tuple[str, str]] = {  # name -> (dispatch, migration policy)
    "mell": ("mell", "mell"),
    "rr+mell": ("round_robin", "mell"),
    "rr": ("round_robin", "none"),
}


@dataclasses.dataclass(frozen=True)
class Planned:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    long: bool


def plan_workload(args: argparse.Namespace) -> list[Planned]:
    import numpy as np
    from llmfleet.workload import poisson

    arrivals = poisson(args.rate, n=args.requests, seed=args.seed)
    rng = np.random.default_rng(args.seed + 1)
    out = []
    for i, a in enumerate(arrivals):
        long = bool(rng.random() < args.long_fraction)
        n = args.long if long else int(rng.integers(args.short_min, args.short_max + 1))
        out.append(Planned(f"r{i}", float(a), int(rng.integers(16, 65)), n, long))
    return out


# ------------------------------------------------------------------------------------------------ live
def start(root: Path, models_dir: Path, s: Settings, dispatch: str, policy: str, log: Any) -> Any:
    import yaml
    from llmfleet.cli.local_cluster import start_local_cluster
    from llmfleet_engine.models import materialize, without_eos

    endless = models_dir / "endless-llama"
    if not endless.exists():
        endless = without_eos(materialize("tiny://llama", models_dir), endless)
    config = {
        "services": {SERVICE: {"model": MODEL, "default_max_tokens": 16, "dispatch": dispatch}},
        "models": {MODEL: {"source": str(endless)}},
        "engines": {eid: {"models": [MODEL]} for eid in ENGINES},
        "migration": {"policy": policy, "epoch_s": EPOCH_S, "load_interval_s": POLL_S},
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    extra = {eid: engine_flags(s) for eid in ENGINES}
    extra["scheduler"] = scheduler_flags(s)
    cluster = start_local_cluster(path, root, extra=extra, prefix=f"/mell-live-{uuid.uuid4().hex[:8]}")
    log(f"cluster up ({dispatch} dispatch, {policy} migration)")
    return cluster


async def status(address: str) -> Any:
    import grpc
    from llmfleet.api.v1 import migration_pb2, migration_pb2_grpc

    async with grpc.aio.insecure_channel(address) as ch:
        return await migration_pb2_grpc.MigrationStub(ch).Status(migration_pb2.StatusRequest(), timeout=5)


async def wait_ready(cluster: Any, timeout: float = 180) -> Any:
    """Every engine has loaded the model, the scheduler routes ``chat`` to all three, the migration
    leader is elected and sees all three engines reporting; the first engine's GetInfo."""
    from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
    from llmfleet.client import AsyncClient
    from llmfleet.rpc.channels import open_channel

    deadline = time.monotonic() + timeout
    info = None
    for eid in ENGINES:
        async with open_channel(cluster.addresses[eid]) as ch:
            stub = engine_pb2_grpc.EngineStub(ch)
            while True:
                got = await stub.GetInfo(engine_pb2.GetInfoRequest(), timeout=10)
                if any(m.name == MODEL for m in got.models):
                    info = info or got
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{eid} did not load {MODEL}")
                await asyncio.sleep(0.25)
    async with AsyncClient(cluster.addresses["scheduler"]) as client:
        while True:
            services = {x.name: x for x in await client.list_services(timeout_s=10)}
            if SERVICE in services and len(services[SERVICE].engines) == len(ENGINES):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler does not route {SERVICE} to every engine: {services}")
            await asyncio.sleep(0.25)
    while True:
        st = await status(cluster.addresses["migration"])
        if st.is_leader and sum(e.reporting for e in st.engines) == len(ENGINES):
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"no migration leader seeing every engine: {st}")
        await asyncio.sleep(0.25)


async def run_live(cluster: Any, planned: list[Planned], seed: int) -> dict[str, Any]:
    from llmfleet.client import AsyncClient

    rng = random.Random(seed)
    prompts = [make_prompt(p.prompt_tokens, rng) for p in planned]
    samples: list[tuple[float, int, int]] = []  # (t, engines holding requests, engines active)
    migrations: dict[str, dict[str, Any]] = {}
    epochs: dict[int, Any] = {}
    t0 = time.monotonic()
    done = asyncio.Event()

    async def poll() -> None:
        while True:
            st = await status(cluster.addresses["migration"])
            now = time.monotonic() - t0
            busy = sum(1 for e in st.engines if e.load.running + e.load.waiting > 0)
            samples.append((now, busy, sum(1 for e in st.engines if e.active)))
            for r in [*st.recent, *st.running]:
                if r.state in ("done", "failed"):
                    migrations[r.migration_id] = {
                        "request_id": r.request_id, "source": r.source, "destination": r.destination,
                        "mode": r.mode, "state": r.state, "seconds": r.seconds, "kv_bytes": r.kv_bytes, "error": r.error,
                    }  # fmt: skip
            for e in st.epochs:
                epochs[e.epoch] = e
            if done.is_set():
                return
            await asyncio.sleep(POLL_S)

    async def one(client: AsyncClient, p: Planned, prompt: str) -> dict[str, Any]:
        await asyncio.sleep(max(0.0, p.arrival_s - (time.monotonic() - t0)))
        sent = time.monotonic()
        first = None
        stream = client.generate(prompt, SERVICE, max_tokens=p.output_tokens)
        async with stream:
            async for chunk in stream:
                if first is None and chunk.token_ids:
                    first = time.monotonic()
        end = time.monotonic()
        u = stream.usage
        return {
            "request_id": p.request_id,
            "planned_arrival_s": p.arrival_s,
            "arrival_s": sent - t0,
            "first_token_s": (first or end) - t0,
            "finish_s": end - t0,
            "prompt_tokens": u.prompt_tokens if u else 0,
            "output_tokens": u.completion_tokens if u else 0,
            "planned_output_tokens": p.output_tokens,
            "long": p.long,
        }

    poller = asyncio.create_task(poll())
    async with AsyncClient(cluster.addresses["scheduler"], timeout_s=600) as client:
        res = await asyncio.gather(
            *(one(client, p, q) for p, q in zip(planned, prompts, strict=True)), return_exceptions=True
        )
    await asyncio.sleep(2 * EPOCH_S)  # the last epochs' records
    done.set()
    await poller
    rows = [r for r in res if isinstance(r, dict)]
    errors = [repr(r) for r in res if not isinstance(r, dict)]
    ep = [epochs[k] for k in sorted(epochs)]
    return {
        "rows": rows,
        "errors": errors,
        "series": samples,
        "migrations": list(migrations.values()),
        "epochs": {
            "count": len(ep),
            "executed": sum(e.executed for e in ep),
            "failed": sum(e.failed for e in ep),
            "planned": sum(e.planned for e in ep),
            "deferred": sum(e.deferred for e in ep),
            "cancelled": sum(e.cancelled for e in ep),
            "deactivations": sum(len(e.deactivated) for e in ep),
            "activations": sum(len(e.activated) for e in ep),
        },
    }


# ----------------------------------------------------------------------------------------- simulation
def simulate(
    rows: list[dict[str, Any]], record: Any, s: Settings, kv: int, tpb: int, dispatch: str, policy: str
) -> dict[str, Any]:
    from llmfleet.policies.placement import InstancePlan
    from llmfleet.sim.run import PolicyBundle
    from llmfleet.sim.run import simulate as sim_run

    spec, wl = replay_spec(rows, s, kv, tpb, len(ENGINES), min(r["output_tokens"] for r in rows))
    bundle = PolicyBundle(
        f"live-{dispatch}-{policy}",
        placement="dedicated_even",
        dispatch=dispatch,
        local="fcfs",
        migration=None if policy == "none" else policy,
        transfer="hybrid",
        migration_epoch_s=EPOCH_S,
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


# ---------------------------------------------------------------------------------------------- metrics
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


def fmt(x: Any, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def failed_why(v: dict[str, Any]) -> str:
    """The live failed moves' distinct errors, shortened."""
    errs = sorted(
        {(m.get("error") or "?")[:80] for m in v["live_migration_records"] if m["state"] == "failed"}
    )
    return f": {'; '.join(f'`{e}`' for e in errs[:3])}" if errs else ""


def markdown(res: dict[str, Any]) -> str:
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
    lines += ["", "Checks:"]
    for name, v in res["variants"].items():
        lv = v["live"]
        lines.append(
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
    lines += [
        "",
        "## What differs between live and simulated",
        "",
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
        "",
        f"Wall time {res['wall_s']:.0f} s (cluster start, profile and calibration included). Load average "
        f"before / after: {res['loadavg'][0][0]:.2f} / {res['loadavg'][1][0]:.2f}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from llmfleet.costmodel import fit_engine_profile, record_from_fit

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r}; valid: {sorted(VARIANTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    load_before = os.getloadavg()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    s = dataclasses.replace(
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
    planned = plan_workload(args)
    log(f"{len(planned)} requests over {planned[-1].arrival_s:.1f} s, {sum(p.long for p in planned)} long")
    base = Path(tempfile.mkdtemp(prefix="llmfleet-mell-live-"))
    models_dir = base / "models"
    live: dict[str, dict[str, Any]] = {}
    samples = groups = info = None
    try:
        for v in variants:
            dispatch, policy = VARIANTS[v]
            cluster = start(base / v, models_dir, s, dispatch, policy, log)
            try:
                got = asyncio.run(wait_ready(cluster))
                if info is None:
                    info = got
                    log(f"KV pool {info.kv_capacity_bytes} B per engine; profiling engine-0")
                    samples = asyncio.run(profile_engine(cluster.addresses[ENGINES[0]], s))
                    if not args.no_calibrate:
                        groups = asyncio.run(calibrate(cluster.addresses[ENGINES[0]], s, random.Random(99)))
                    log(f"profile: {len(samples)} samples, {len(groups or [])} calibration groups")
                log(f"live {v}: sending {len(planned)} requests")
                t = time.perf_counter()
                live[v] = asyncio.run(run_live(cluster, planned, args.seed))
                live[v]["wall_s"] = time.perf_counter() - t
                log(f"live {v}: done in {live[v]['wall_s']:.1f} s, {len(live[v]['migrations'])} migrations")
            finally:
                cluster.stop()
    finally:
        if args.keep:
            log(f"state and logs kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    assert info is not None and samples is not None
    model = next(x for x in info.models if x.name == MODEL)
    kv, tpb = info.kv_capacity_bytes, model.tokens_per_block
    per_token = info.kv_block_bytes / tpb if tpb else 0
    fit = fit_engine_profile(samples)
    raw = record_from_fit(fit, MODEL, HARDWARE, "native")
    record, record_name, overhead = raw, "raw", None
    if groups:
        o = fit_overhead(groups, raw.aladdin.prefill, raw.aladdin.decode)
        record, record_name, overhead = with_overhead(raw, o), "calibrated", o.to_dict()
    res: dict[str, Any] = {
        "settings": vars(args),
        "engine": {
            "kv_capacity_bytes": kv,
            "kv_block_bytes": info.kv_block_bytes,
            "tokens_per_block": tpb,
            "kv_capacity_tokens": int(kv / per_token) if per_token else 0,
        },
        "sim_record": record_name,
        "records": {"raw": raw.to_dict(), "calibrated": record.to_dict() if groups else None},
        "overhead": overhead,
        "variants": {},
    }
    n = len(planned)
    for v in variants:
        dispatch, policy = VARIANTS[v]
        lv = live[v]
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
        sims = {
            k: simulate(sim_in, rec, s, kv, tpb, dispatch, policy)
            for k, rec in (("raw", raw), ("headline", record))
        }
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
        res["variants"][v] = entry
        L, S = entry["live"], entry["sim"]
        log(
            f"{v}: completed {L['completed']}/{n} (wrong tokens {len(wrong)}), peak busy {L['peak_busy_engines']} "
            f"/ {S['peak_busy_engines']}, mean {L['mean_busy_engines']:.2f} / {S['mean_busy_engines']:.2f}, "
            f"migrations {L['migrations']} / {S['migrations']}, p50 {fmt(L['latency_p50_s'])} / "
            f"{fmt(S['latency_p50_s'])} s, p99 {fmt(L['latency_p99_s'])} / {fmt(S['latency_p99_s'])} s"
        )
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
