"""Metrics of a simulation (or of a live run, from the same records).

Per request: TTFT, TPOT (= Aladdin's ATGT: (finish − first token)/(l_out − 1), 0 for one token),
end-to-end latency, normalized latency L_r / L̂_s (SeaLLM: L̂_s = the service's mean execution time,
the mean of its requests' solo times at the model's fixed reference TP, ``SimSpec.reference_tps``, so
that every system compared on the same requests has the same denominator). SLO attainment, each paper's definition (a failed request misses
every SLO):

- ``aladdin``: TTFT ≤ T_pre and ATGT ≤ T_dec (services whose ``slo`` sets ``ttft_s`` and ``tpot_s``)
- ``seallm``:  latency ≤ ``slo.latency_scale`` × the request's execution time (default 5×)
- ``uellm``:   latency ≤ ``slo.deadline_s`` (services that set it)

``slo_met`` is the all-objectives form (every objective the service sets) that placement measures.
``aladdin_at``: Aladdin's attainment at P100 (every request, the paper's "P100 SLO-guaranteed") and
P99 — the percentile of max(TTFT/T_pre, ATGT/T_dec) and whether it is ≤ 1 (:func:`attainment_at`).

Cluster: throughput (requests and output tokens per second over the makespan, first arrival to last
finish), busy GPU-seconds (Σ tp × busy time of each instance), GPU-seconds (∫ GPUs in use over the
makespan: an instance counts its GPUs from when it takes them — loading included — until it gives them
back; with a fixed plan, provisioned GPUs × makespan), GPUs in use over time, peak and time-weighted
mean active GPUs (instances with requests), mean and peak KV utilisation (from the periodic samples).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.simulator import Sample, SimResult
from llmfleet.sim.spec import SimService
from llmfleet.types import Slo

PCTS = (50, 90, 99)


def dist(values: Sequence[float]) -> dict[str, float]:
    """mean / p50 / p90 / p99 / max (NaN-free: empty → zeros with n = 0)."""
    if len(values) == 0:
        return {"n": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    a = np.asarray(values, dtype=float)
    p = np.percentile(a, PCTS)
    return {
        "n": int(a.size),
        "mean": float(a.mean()),
        **{f"p{q}": float(v) for q, v in zip(PCTS, p, strict=True)},
        "max": float(a.max()),
    }


def slo_met(r: RequestRecord, slo: Slo) -> bool:
    """Whether ``r`` finished within every objective ``slo`` sets: latency ≤ ``latency_scale`` × its
    execution time alone (SeaLLM), TTFT and TPOT (Aladdin), the deadline (UELLM)."""
    if not r.done or r.latency_s > slo.latency_scale * r.solo_s:
        return False
    if slo.ttft_s is not None and r.ttft_s > slo.ttft_s:
        return False
    if slo.tpot_s is not None and r.tpot_s > slo.tpot_s:
        return False
    return slo.deadline_s is None or r.latency_s <= slo.deadline_s


ATTAINMENT_PCTS = (100, 99)  # Aladdin §6: GPUs for P100 SLO-guaranteed serving, and P99


def aladdin_ratio(r: RequestRecord, slo: Slo) -> float:
    """How far ``r`` is from Aladdin's SLO: max(TTFT / T_pre, ATGT / T_dec); ≤ 1 iff it attains it
    (inf for a failed request; a one-token request has ATGT 0, met)."""
    if not r.done or r.failed or slo.ttft_s is None or slo.tpot_s is None:
        return math.inf
    return max(_frac(r.ttft_s, slo.ttft_s), _frac(r.tpot_s, slo.tpot_s))


def _frac(value: float, limit: float) -> float:
    if limit > 0:
        return value / limit
    return 0.0 if value <= 0 else math.inf


def attainment_at(records: Sequence[RequestRecord], slos: Mapping[str, Slo], pct: float) -> dict | None:
    """Aladdin SLO attainment at percentile ``pct`` (100: every request, 99: P99) over the records of
    services with both TTFT and ATGT objectives: ``ratio`` = the pct-th percentile (inverted CDF, no
    interpolation) of :func:`aladdin_ratio`, ``met`` = ratio ≤ 1, i.e. at least pct % of the requests
    attain both (a failed request never does). None when no record has such a service."""
    ratios = [
        aladdin_ratio(r, slos[r.service])
        for r in records
        if slos[r.service].ttft_s is not None and slos[r.service].tpot_s is not None
    ]
    if not ratios:
        return None
    a = np.sort(np.asarray(ratios, dtype=float))
    k = max(0, math.ceil(pct / 100.0 * a.size - 1e-9) - 1)  # smallest value with ≥ pct % at or below
    ratio = float(a[min(k, a.size - 1)])
    return {"pct": pct, "ratio": ratio, "met": ratio <= 1.0}


def gpu_seconds(gpu_log: Sequence[tuple[float, int]], start: float, end: float) -> float:
    """∫ GPUs in use over [start, end], from the (time, GPUs in use) change points (the value before
    the first change point is the first one's)."""
    if not gpu_log or end <= start:
        return 0.0
    area, level, t = 0.0, gpu_log[0][1], start
    for when, n in gpu_log:
        if when > t:
            area += level * (min(when, end) - t)
            t = min(when, end)
        level = n
    return area + level * (end - t)


@dataclass(frozen=True)
class SloKind:
    """One paper's SLO attainment: whether a service's SLO sets it (``sets``; its requests are the
    attainment's denominator), whether a finished request of that service meets it (``met``), and
    whether a report carries it even when no request counts (``always``; its value is then None)."""

    sets: Callable[[Slo], bool]
    met: Callable[[RequestRecord, Slo], bool]
    always: bool = False


def _aladdin_met(r: RequestRecord, slo: Slo) -> bool:
    return r.ttft_s <= cast(float, slo.ttft_s) and r.tpot_s <= cast(float, slo.tpot_s)


# the attainments ``request_metrics`` reports under "slo", by name (see the module docstring)
SLO_KINDS: dict[str, SloKind] = {
    "seallm": SloKind(  # every service has SeaLLM's
        lambda slo: True, lambda r, slo: r.latency_s <= slo.latency_scale * r.solo_s, always=True
    ),
    "aladdin": SloKind(lambda slo: slo.ttft_s is not None and slo.tpot_s is not None, _aladdin_met),
    "uellm": SloKind(
        lambda slo: slo.deadline_s is not None, lambda r, slo: r.latency_s <= cast(float, slo.deadline_s)
    ),
}


def _attain(records: Sequence[RequestRecord], kind: SloKind, slos: Mapping[str, Slo]) -> float | None:
    """The share of ``records`` that finished within ``kind``'s SLO of their service (None: no record)."""
    if not records:
        return None
    met = kind.met
    return sum(1 for r in records if r.done and met(r, slos[r.service])) / len(records)


def request_metrics(records: Sequence[RequestRecord], services: Sequence[SimService]) -> dict:
    """Latency distributions and SLO attainment over ``records`` (one service or all)."""
    by_name = {s.name: s for s in services}
    done = [r for r in records if r.done]
    solo_mean: dict[str, float] = {}
    for name in {r.service for r in records}:
        solos = [r.solo_s for r in records if r.service == name and r.solo_s > 0]
        solo_mean[name] = float(np.mean(solos)) if solos else 0.0
    norm = [r.latency_s / solo_mean[r.service] for r in done if solo_mean[r.service] > 0]
    out: dict = {
        "requests": len(records),
        "completed": len(done),
        "failed": sum(1 for r in records if r.failed),
        "ttft_s": dist([r.ttft_s for r in done]),
        "tpot_s": dist([r.tpot_s for r in done]),
        "latency_s": dist([r.latency_s for r in done]),
        "normalized_latency": dist(norm),
        "preemptions": sum(r.preemptions for r in records),
        # static batching: times a request went back unfinished (SCLS: reschedules, one per extra slice)
        "reschedules": dist([r.requeues for r in done]),
        "rescheduled_under_3": sum(1 for r in done if r.requeues < 3) / len(done) if done else 0.0,
        "prefix_cache": prefix_cache([r for r in done if r.cached_tokens is not None]),
        "slo": {},
    }
    slo = {name: s.slo for name, s in by_name.items()}
    for name, kind in SLO_KINDS.items():
        counted = [r for r in records if kind.sets(slo[r.service])]
        if counted or kind.always:
            out["slo"][name] = _attain(counted, kind, slo)
    at = {f"p{pct}": attainment_at(records, slo, pct) for pct in ATTAINMENT_PCTS}
    if all(v is not None for v in at.values()):
        out["aladdin_at"] = at  # Aladdin's attainment at P100 and P99 (``attainment_at``)
    return out


def prefix_cache(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """The prompt tokens the requests' first prefills found in the prefix cache, against their prompt
    tokens (the requests that say: in a live report, those whose final usage carried the count)."""
    sent = sum(r.prompt_tokens for r in records)
    cached = sum(r.cached_tokens or 0 for r in records)
    return {
        "requests": len(records),
        "prompt_tokens": sent,
        "cached_tokens": cached,
        "cached_share": cached / sent if sent else None,
    }


def mean_active_gpus(samples: Sequence[Sample], end_s: float) -> float:
    """Time-weighted mean of the step function given by the samples up to ``end_s``."""
    if not samples:
        return 0.0
    total = area = 0.0
    for s, nxt in zip(samples, [*samples[1:], None], strict=True):
        t1 = nxt.t if nxt is not None else max(end_s, s.t)
        area += s.active_gpus * (t1 - s.t)
        total += t1 - s.t
    return area / total if total > 0 else float(samples[-1].active_gpus)


def _active_utilization(samples: Sequence[Sample]) -> float:
    """Mean KV utilization of the active GPUs (instances with work) over the samples that have any
    (samples are evenly spaced: a time-weighted mean): KV in use over their KV capacity."""
    u = [s.kv_used / s.active_kv_capacity for s in samples if s.active_kv_capacity]
    return float(np.mean(u)) if u else 0.0


def _active_memory_utilization(samples: Sequence[Sample]) -> float:
    """As :func:`_active_utilization`, of GPU memory: (weights + KV in use) over the active GPUs'
    memory — Mell's "GPU utilization (i.e., percentage of GPU memory in use)" (§VIII-B Metrics, Fig. 14)."""
    u = [s.active_mem_used / s.active_mem_capacity for s in samples if s.active_mem_capacity]
    return float(np.mean(u)) if u else 0.0


def cluster_metrics(result: SimResult) -> dict:
    recs = result.records
    done = [r for r in recs if r.done]
    start = min((r.arrival_s for r in recs), default=0.0)
    end = max((r.finish_s for r in recs if r.finish_s is not None), default=start)  # of those done
    span = max(end - start, 1e-12)
    kv = [s.kv_used / s.kv_capacity for s in result.samples if s.kv_capacity]
    gpu_s = sum(i["tp"] * i["busy_s"] for i in result.instances)
    log = result.gpu_log or [(start, result.provisioned_gpus)]
    in_use = gpu_seconds(log, start, end)
    batches = sum(i.get("static_batches", 0) for i in result.instances)
    return {
        "makespan_s": end - start,
        "throughput_rps": len(done) / span,
        "throughput_tokens_per_s": sum(r.output_tokens for r in done) / span,
        "gpu_seconds_busy": gpu_s,
        "gpu_seconds": in_use,
        "gpu_seconds_provisioned": result.provisioned_gpus * span,
        "provisioned_gpus": result.provisioned_gpus,
        "mean_gpus_in_use": in_use / span if end > start else float(log[-1][1]),
        "gpus_in_use": [[t, n] for t, n in log],
        "instances": len(result.instances),
        "peak_active_gpus": max((s.active_gpus for s in result.samples), default=0),
        "mean_active_gpus": mean_active_gpus(result.samples, end),
        "fluid_bound_gpus": max((s.fluid_gpus for s in result.samples), default=0),
        "active_kv_utilization_mean": _active_utilization(result.samples),
        "active_memory_utilization_mean": _active_memory_utilization(result.samples),
        "kv_utilization_mean": float(np.mean(kv)) if kv else 0.0,
        "kv_utilization_peak": float(max(kv)) if kv else 0.0,
        "iterations": sum(i["iterations"] for i in result.instances),
        "adapter_loads": sum(i["adapter_loads"] for i in result.instances),  # LoRA slot misses
        "static_batches": batches,
        # SCLS §5.6: batches that ended before their slice limit because every row finished
        "early_return_fraction": sum(i.get("early_returns", 0) for i in result.instances) / batches
        if batches
        else 0.0,
        "events": result.events,
        "wall_s": result.wall_s,
        "events_per_s": result.events / result.wall_s if result.wall_s > 0 else 0.0,
        "workers": result.workers,
    }


def summarize(result: SimResult, services: Sequence[SimService]) -> dict:
    """The whole report: overall and per-service request metrics plus cluster metrics."""
    per = {}
    for s in services:
        rs = [r for r in result.records if r.service == s.name]
        if rs:
            per[s.name] = request_metrics(rs, services)
    out: dict[str, Any] = {
        "overall": request_metrics(result.records, services),
        "services": per,
        "cluster": cluster_metrics(result),
        "cost_models": result.cost_sources,
    }
    if result.placement:
        out["placement"] = result.placement
    if result.stopped_s is not None:  # ended early by ``Simulator.run``'s ``stop``: over the records so far
        out["stopped_s"] = result.stopped_s
    return out
