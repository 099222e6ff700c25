"""From a measurement (profile samples, calibration groups, live runs) to the report: the cost-model fits,
the calibrations, the simulations and the comparisons."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from typing import Any

import numpy as np
from llmfleet.costmodel import fit_engine_profile, record_from_fit

from .calibrate import CalibrationGroup, deployed_overhead, fit_overhead, with_overhead
from .cluster import scheduler_flags
from .metrics import compare, mean_summary, spread, summarize, summarize_usage
from .replay import simulate
from .workload import HARDWARE, MODEL, Settings


def analyse(meas: dict[str, Any], s: Settings, log: Any) -> dict[str, Any]:
    """The report of a measurement (written by :func:`~.cli.measure`, or loaded with ``--resimulate``)."""

    load_before, load_after = meas["loadavg"]
    t_analysis = time.perf_counter()
    runs, direct, timings = meas["runs"], meas["direct"], dict(meas["timings"])
    groups, cluster_groups = _groups(meas)
    kv, tpb = meas["engine"]["kv_capacity_bytes"], meas["engine"]["tokens_per_block"]

    _check_lengths(runs, direct)
    fit = fit_engine_profile(meas["samples"])
    record = record_from_fit(fit, MODEL, HARDWARE, "native")
    pre, dec = record.aladdin.prefill, record.aladdin.decode
    log(f"fit: k1={pre.k1:.3e} c1={pre.c1:.3e} k2={dec.k2:.3e} c2={dec.c2:.3e} c3={dec.c3:.3e}")

    t = time.perf_counter()
    sims, calibration = _simulate(runs[0], record, groups, cluster_groups, s, kv, tpb, log)
    timings["sim_s"] = time.perf_counter() - t

    live_runs = [summarize(r) for r in runs]
    live = mean_summary(live_runs)
    sched = mean_summary([summarize_usage(r, "scheduler") for r in runs])
    report: dict[str, Any] = {
        "settings": dataclasses.asdict(s),
        "machine": _machine(load_before, load_after),
        "engine": meas["engine"],
        "scheduler_flags": scheduler_flags(s),
        "fit": {
            **pre.to_dict(),
            **dec.to_dict(),
            "reports": {k: r.to_dict() for k, r in fit.reports.items()},
        },
        "record": record.to_dict(),
        "profile_samples": meas["samples"],
        "calibration": calibration,
        "live": {"summary": live, "runs": live_runs, "spread": spread(live_runs)},
        "live_scheduler_side": {"summary": sched},
        "direct": (
            {"engine_side": summarize_usage(direct, "engine"), "client_side": summarize(direct)}
            if direct
            else None
        ),
        "sim": sims,
        "comparison": {v: compare(live, x["summary"]) for v, x in sims.items()},
        "diagnostics": _diagnostics(runs, meas),
        "timings": timings,
        "runtime_s": meas["runtime_s"] + time.perf_counter() - t_analysis,
        "live_requests": runs,
        "direct_requests": direct,
    }
    if direct:
        report["comparison_direct_engine_side"] = {
            v: compare(report["direct"]["engine_side"], x["summary"])
            for v, x in sims.items()
            if v != "deployed"
        }
    return report


def _groups(meas: dict[str, Any]) -> tuple[list[CalibrationGroup], list[CalibrationGroup]]:
    """The engine-side and the as-deployed calibration groups of a measurement."""
    groups, cluster_groups = (
        [
            CalibrationGroup(**{k: tuple(v) if isinstance(v, list) else v for k, v in g.items()})
            for g in meas.get(key, [])
        ]
        for key in ("groups", "cluster_groups")
    )
    return groups, cluster_groups


def _check_lengths(runs: list[list[dict[str, Any]]], direct: list[dict[str, Any]] | None) -> None:
    """Every request generated its planned length (else the comparison is meaningless)."""
    for rows in [*runs, *([direct] if direct else [])]:
        wrong = [r for r in rows if r["output_tokens"] != r.get("planned_output_tokens", r["output_tokens"])]
        if wrong:
            raise RuntimeError(f"{len(wrong)} requests did not generate their planned length: {wrong[:3]}")


def _simulate(
    rows: list[dict[str, Any]],
    record: Any,
    groups: list,
    cluster_groups: list,
    s: Settings,
    kv: int,
    tpb: int,
    log,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The workload simulated with the raw fit, the calibrated record and the one calibrated as deployed;
    the calibration's report (None without groups)."""
    pre, dec = record.aladdin.prefill, record.aladdin.decode
    sims = {"raw": simulate(rows, record, s, kv, tpb)}
    calibration = None
    if groups:
        o = fit_overhead(groups, pre, dec)
        calibrated = with_overhead(record, o)
        sims["calibrated"] = simulate(rows, calibrated, s, kv, tpb)
        log(
            f"calibration: o1 {o.prefill_s * 1e3:.3f} ms, o3 {o.per_iteration_s * 1e3:.3f} ms, "
            f"o2 {o.per_sequence_s * 1e3:.3f} ms"
        )
        calibration = {
            "groups": [
                {
                    **dataclasses.asdict(g),
                    "iteration_s": g.iteration_s,
                    "fitted_iteration_s": dec.predict(g.batch, g.mean_context),
                }
                for g in groups
            ],
            "overhead": o.to_dict(),
            "record": calibrated.to_dict(),
        }
        if cluster_groups:
            od, hop = deployed_overhead(o, groups, cluster_groups, pre, dec)
            deployed = with_overhead(record, od)
            sims["deployed"] = simulate(rows, deployed, s, kv, tpb, hop_s=hop)
            log(
                f"as deployed: o3 {od.per_iteration_s * 1e3:.3f} ms, o2 {od.per_sequence_s * 1e3:.3f} ms, "
                f"hop {hop * 1e3:.3f} ms"
            )
            calibration["deployed"] = {
                "groups": [{**dataclasses.asdict(g), "iteration_s": g.iteration_s} for g in cluster_groups],
                "overhead": od.to_dict(),
                "hop_s": hop,
                "record": deployed.to_dict(),
            }
    return sims, calibration


def _machine(load_before: Any, load_after: Any) -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }


def _diagnostics(runs: list[list[dict[str, Any]]], meas: dict[str, Any]) -> dict[str, Any]:
    """The hop between client and scheduler, the send lag, lengths as planned, Little's-law latencies."""
    every = [r for rs in runs for r in rs]
    lags = [r["arrival_s"] - r["planned_arrival_s"] for r in every]
    return {
        "client_minus_scheduler_latency_mean_s": float(
            np.mean([r["finish_s"] - r["arrival_s"] - r["scheduler_latency_s"] for r in every])
        ),
        "send_lag_mean_s": float(np.mean(lags)),
        "send_lag_max_s": float(np.max(lags)),
        "prompt_lengths_match": sum(r["prompt_tokens"] == r["planned_prompt_tokens"] for r in every),
        "output_lengths_match": sum(r["output_tokens"] == r["planned_output_tokens"] for r in every),
        "requests_total": len(every),
        "engine_little_latency_s": meas.get("engine_little_latency_s", {}),
    }
