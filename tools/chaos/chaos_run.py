"""One chaos run: the reference, then steady load with a baseline phase and each fault in turn
(inject, heal, wait until the cluster is whole, settle); requests count in the phase they started in."""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tools.chaos.chaos_cluster import ChaosCluster
from tools.chaos.chaos_faults import FaultResult, inject
from tools.chaos.chaos_load import LENGTHS, Load, compute_reference
from tools.chaos.chaos_outcomes import counts, max_stall
from tools.toolkit.stats import pct

log = logging.getLogger("chaos")

Phase = tuple[str, float, float]  # (name, start, end) on the monotonic clock


@dataclass(frozen=True)
class FaultTimings:
    """How long a fault phase waits: kill -> restart, for the cluster to be whole, then settled load."""

    restart_delay_s: float
    whole_timeout_s: float
    settle_s: float


async def run_chaos(
    cluster: ChaosCluster,
    faults: Sequence[str],
    *,
    concurrency: int,
    baseline_s: float,
    settle_s: float,
    restart_delay_s: float,
    whole_timeout_s: float,
    drain_s: float,
    sdk_retries: int | None = None,
    http_retries: int = 5,
    lengths: Sequence[int] = LENGTHS,
    seed: int = 0,
) -> dict[str, Any]:
    """Reference, then load: a baseline phase, then each fault in turn; returns the report dict."""
    await cluster.wait_routed()
    t_ref = time.monotonic()
    reference = await compute_reference(cluster.sdk_addresses[0], lengths)
    log.info(
        "reference of %d (prompt, length) pairs in %.1fs", len(reference.token_ids), time.monotonic() - t_ref
    )
    load = Load.on(
        cluster,
        reference,
        concurrency=concurrency,
        lengths=lengths,
        sdk_retries=sdk_retries,
        http_retries=http_retries,
        seed=seed,
    )
    rss_start = cluster.rss_kib()
    t_load = time.monotonic()
    await load.start()
    results: list[FaultResult] = []
    await asyncio.sleep(baseline_s)
    phases: list[Phase] = [("baseline", t_load, time.monotonic())]
    timings = FaultTimings(restart_delay_s, whole_timeout_s, settle_s)
    for k, fault in enumerate(faults, start=1):
        load.set_phase(k)
        result, phase = await _fault_phase(cluster, load, fault, f"{k}/{len(faults)}", t_load, timings)
        results.append(result)
        phases.append(phase)
    load.set_phase(len(faults) + 1)
    await load.stop(drain_s)
    rss_end = cluster.rss_kib()
    _tally_faults(load, results, phases)
    settings = {
        "concurrency": concurrency,
        "baseline_s": baseline_s,
        "settle_s": settle_s,
        "restart_delay_s": restart_delay_s,
        "sdk_retries": sdk_retries if sdk_retries is not None else "SDK default",
        "http_retries": http_retries,
    }
    baseline = [o for o in load.outcomes if o.phase == 0]
    tail = [o for o in load.outcomes if o.phase == len(faults) + 1]
    return {
        "config": _config(cluster, load, faults, lengths, settings),
        "baseline": {
            **counts(baseline),
            "max_stall_s": round(max_stall(load.token_times, *phases[0][1:]), 2),
        },
        "faults": [asdict(r) for r in results],
        "after_faults": counts(tail),
        "total": counts(load.outcomes),
        "ttft_p50_s": pct([o.ttft_s for o in load.outcomes if o.ttft_s is not None], 50),
        "rss_kib": {"start": rss_start, "end": rss_end},
        "duration_s": round(time.monotonic() - t_load, 1),
    }


async def _fault_phase(
    cluster: ChaosCluster,
    load: Load,
    fault: str,
    label: str,
    t_load: float,
    timings: FaultTimings,
) -> tuple[FaultResult, Phase]:
    """Inject ``fault``, heal, wait until whole, settle; the fault's timings and its phase (``label``:
    "k/n" in the log)."""
    t0 = time.monotonic()
    in_flight = sum(o.status == "running" for o in load.outcomes)
    log.info("fault %s: %s (%d requests in flight)", label, fault, in_flight)
    exits_before = len(cluster.unexpected_exits)
    target, healed, startup = await inject(cluster, fault, timings.restart_delay_s)
    t_heal = t0 + healed
    took, why = await cluster.wait_whole(timings.whole_timeout_s)
    t_whole = time.monotonic()
    await asyncio.sleep(timings.settle_s)
    phase = (fault, t0, time.monotonic())
    result = FaultResult(
        fault=fault,
        target=target,
        injected_at_s=round(t0 - t_load, 2),
        healed_after_s=round(healed, 2),
        startup_s=round(startup, 2),
        whole_after_inject_s=None if took is None else round(t_whole - t0, 2),
        whole_after_heal_s=None if took is None else round(t_whole - t_heal, 2),
        not_whole_reason=why,
        in_flight_at_inject=in_flight,
        unexpected_exits=cluster.unexpected_exits[exits_before:],
    )
    log.info("  %s: healed after %.1fs, whole after %s", target, healed, result.whole_after_inject_s)
    return result, phase


def _tally_faults(load: Load, results: list[FaultResult], phases: list[Phase]) -> None:
    """Each fault's request counts, longest token stall and retry reasons (its phase: ``k``)."""
    for k, r in enumerate(results, start=1):
        r.counts = counts([o for o in load.outcomes if o.phase == k])
        _, start, end = phases[k]
        r.max_stall_s = round(max_stall(load.token_times, start, end), 2)
        r.counts["retry_reasons"] = dict(load.retry_reasons.get(k, Counter()).most_common(6))


def _config(
    cluster: ChaosCluster,
    load: Load,
    faults: Sequence[str],
    lengths: Sequence[int],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The report's ``config``: the load, the cluster, the timings and the machine."""
    return {
        "concurrency": settings["concurrency"],
        "http_workers": load.n_http,
        "sdk_workers": settings["concurrency"] - load.n_http,
        "lengths": list(lengths),
        "ttl_s": cluster.ttl,
        "engines": cluster.engine_ids,
        "processes": sorted(cluster.nodes),
        "baseline_s": settings["baseline_s"],
        "settle_s": settings["settle_s"],
        "restart_delay_s": settings["restart_delay_s"],
        "sdk_retries": settings["sdk_retries"],
        "http_retries": settings["http_retries"],
        "faults": list(faults),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "engine_freeze_note": "no network namespaces: 'cut off the network' is SIGSTOP of the engine",
    }
