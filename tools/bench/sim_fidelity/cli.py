"""The command line: arguments, the measurement phases on the live cluster, ``main``."""

from __future__ import annotations

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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .analysis import analyse
from .calibrate import CalibrationGroup, calibrate, calibrate_cluster
from .cluster import profile_engine, start_cluster, wait_ready
from .metrics import little_latency, summarize
from .replay import replay, replay_direct
from .report import write_report
from .workload import ENGINE_ID, MODEL, Settings, plan_workload


def stderr_log(t_start: float) -> Callable[[str], None]:
    """``log(msg)``: the message on stderr after the seconds since ``t_start`` (``time.perf_counter``)."""

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    return log


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Settings]:
    d = Settings()
    ap = argparse.ArgumentParser(
        description=sys.modules[__package__].__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=".bench", help="output directory (default .bench)")
    ap.add_argument("--requests", type=int, default=d.requests)
    ap.add_argument("--rate", type=float, default=d.rate_rps, help="Poisson arrival rate (req/s)")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--max-batch", type=int, default=d.max_batch, help="max running = max batch requests")
    ap.add_argument("--max-prefill-tokens", type=int, default=d.max_prefill_tokens)
    ap.add_argument("--threads", type=int, default=d.threads, help="engine torch threads")
    ap.add_argument(
        "--live-runs", type=int, default=d.live_runs, help="cluster runs of the workload (noise floor)"
    )
    ap.add_argument("--no-direct", action="store_true", help="skip the diagnostic run straight to the engine")
    ap.add_argument(
        "--scheduler-predict", action="store_true", help="keep the scheduler's Predict call before dispatch"
    )
    ap.add_argument("--no-calibrate", action="store_true", help="only the raw profile fit")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's state dir (logs) afterwards")
    ap.add_argument(
        "--resimulate",
        metavar="JSON",
        help="no live cluster: re-analyse a saved sim_fidelity_measurement.json (written by every run)",
    )
    args = ap.parse_args(argv)
    s = dataclasses.replace(
        d,
        requests=args.requests,
        rate_rps=args.rate,
        seed=args.seed,
        max_batch=args.max_batch,
        max_prefill_tokens=args.max_prefill_tokens,
        threads=args.threads,
        live_runs=args.live_runs,
        direct_run=not args.no_direct,
        scheduler_predict=args.scheduler_predict,
        calibrate=not args.no_calibrate,
    )
    return args, s


def measure(s: Settings, root: Path, log: Any) -> dict[str, Any]:
    """Everything that needs the live cluster: profile, calibration phases around the runs, the runs."""
    planned = plan_workload(s)
    timings = {"calibration_s": 0.0, "live_s": 0.0, "direct_s": 0.0}
    groups: list[CalibrationGroup] = []
    cluster_groups: list[CalibrationGroup] = []
    runs: list[list[dict[str, Any]]] = []
    direct: list[dict[str, Any]] | None = None
    loads: dict[str, Any] = {}  # engine-side mean latency by Little's law over WatchLoad, per run
    calib_rng = random.Random(s.seed + 99)
    t = time.perf_counter()
    cluster = start_cluster(root, s, log)
    try:
        info = asyncio.run(wait_ready(cluster))
        timings["cluster_start_s"] = time.perf_counter() - t
        log(f"engine ready: KV pool {info.kv_capacity_bytes} B")
        engine = cluster.addresses[ENGINE_ID]

        t = time.perf_counter()
        samples = asyncio.run(profile_engine(engine, s))
        timings["profile_s"] = time.perf_counter() - t

        # calibration phases bracket every run (calib, run, calib, run, ..., calib): slow drift in the
        # machine's load then biases neither side; the direct run sits between the cluster runs
        plan = ["cluster"] * s.live_runs
        if s.direct_run:
            plan.insert(1, "direct")
        for what in [*plan, None]:
            if s.calibrate:
                t = time.perf_counter()
                groups += asyncio.run(calibrate(engine, s, calib_rng))
                cluster_groups += asyncio.run(calibrate_cluster(cluster.addresses["scheduler"], s, calib_rng))
                timings["calibration_s"] += time.perf_counter() - t
            if what is None:
                break
            t = time.perf_counter()
            if what == "direct":
                log("direct run: the workload straight to the engine")
                direct, direct_load = asyncio.run(replay_direct(engine, planned, s))
                loads["direct"] = little_latency(direct_load, len(direct))
                timings["direct_s"] += time.perf_counter() - t
                continue
            log(f"live run {len(runs) + 1}/{s.live_runs}: {s.requests} requests at {s.rate_rps} req/s")
            rows, load = asyncio.run(replay(cluster.addresses["scheduler"], planned, s, engine))
            runs.append(rows)
            loads.setdefault("cluster", []).append(little_latency(load, len(rows)))
            timings["live_s"] += time.perf_counter() - t
            x = summarize(runs[-1])
            log(
                f"live run {len(runs)}: mean latency {x['latency_mean_s'] * 1e3:.1f} ms, p99 "
                f"{x['latency_p99_s'] * 1e3:.1f} ms, {x['throughput_rps']:.2f} req/s"
            )
    finally:
        t = time.perf_counter()
        cluster.stop()
        timings["shutdown_s"] = time.perf_counter() - t
    model = next(x for x in info.models if x.name == MODEL)
    return {
        "settings": dataclasses.asdict(s),
        "engine": {
            "kv_capacity_bytes": info.kv_capacity_bytes,
            "kv_block_bytes": info.kv_block_bytes,
            "tokens_per_block": model.tokens_per_block,
        },
        "samples": samples,
        "groups": [dataclasses.asdict(g) for g in groups],
        "cluster_groups": [dataclasses.asdict(g) for g in cluster_groups],
        "runs": runs,
        "direct": direct,
        "engine_little_latency_s": loads,
        "timings": timings,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args, s = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    log = stderr_log(t_start)
    if args.resimulate:  # analyse a saved measurement again (e.g. after a simulator change)
        meas = json.loads(Path(args.resimulate).read_text())
        s = Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in meas["settings"].items()})
    else:
        root = Path(tempfile.mkdtemp(prefix="llmfleet-fidelity-"))
        try:
            meas = measure(s, root, log)
        finally:
            if args.keep:
                log(f"cluster state and logs kept in {root}")
            else:
                shutil.rmtree(root, ignore_errors=True)
        meas["loadavg"] = [load_before, os.getloadavg()]
        meas["runtime_s"] = time.perf_counter() - t_start
        (out / "sim_fidelity_measurement.json").write_text(json.dumps(meas) + "\n")
    report = analyse(meas, s, log)
    print(write_report(out, report))
    return 0
