"""The faults of a chaos run: kill -9 and restart a process (an engine, a scheduler replica, the
profiler, the placement or migration leader, etcd), or freeze one (etcd, an engine) past the lease TTL."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from tools.chaos.chaos_cluster import ChaosCluster

ALL_FAULTS = (
    "engine",
    "scheduler",
    "profiler",
    "placement-leader",
    "migration-leader",
    "etcd-kill",
    "etcd-freeze",
    "engine-freeze",
)


@dataclass
class FaultResult:
    """One fault of a run: its target, its timings and the counts of the requests started meanwhile."""

    fault: str
    target: str
    injected_at_s: float  # since the load started
    healed_after_s: float  # inject -> heal (restart / SIGCONT)
    startup_s: float  # heal -> the restarted process answers gRPC health (its own start-up time)
    whole_after_inject_s: float | None
    whole_after_heal_s: float | None
    not_whole_reason: str = ""
    max_stall_s: float = 0.0  # longest time without a token reaching any client, inject -> whole + settle
    in_flight_at_inject: int = 0
    unexpected_exits: list[str] = field(default_factory=list)  # children that died on their own (restarted)
    counts: dict[str, Any] = field(default_factory=dict)


async def inject(cluster: ChaosCluster, fault: str, restart_delay_s: float) -> tuple[str, float, float]:
    """Inject ``fault``, wait, heal; returns (the target, seconds from inject to heal, seconds from the
    heal until a restarted process answers health (0 when nothing was restarted))."""
    t0 = time.monotonic()
    freeze_s = 1.5 * cluster.ttl
    if fault in ("engine", "scheduler", "profiler", "placement-leader", "migration-leader"):
        target = {"engine": cluster.engine_ids[0], "scheduler": "scheduler", "profiler": "profiler"}.get(
            fault
        )
        if target is None:
            role = fault.split("-")[0]
            target, why = await cluster.leader(role)
            if target not in cluster.nodes:
                raise RuntimeError(f"no {role} leader in etcd (got {target!r}; {why})")
        t0 = time.monotonic()
        cluster.restart_exited()
        cluster.group.kill(target, signal.SIGKILL)
        cluster.group.poll_exited()  # our kill: not an unexpected exit
        await asyncio.sleep(restart_delay_s)
        await cluster.respawn(target)
        t_heal = time.monotonic()
        with contextlib.suppress(Exception):  # a child that never gets healthy shows as "never whole"
            await cluster.group.wait_healthy_async(target, cluster.nodes[target].address, timeout=120)
        return target, t_heal - t0, time.monotonic() - t_heal
    elif fault == "etcd-kill":
        target = "etcd"
        cluster.etcd.kill()
        await asyncio.sleep(restart_delay_s)
        t_heal = time.monotonic()
        await cluster.etcd.astart()
        return target, t_heal - t0, time.monotonic() - t_heal
    elif fault == "etcd-freeze":
        target = "etcd"
        cluster.etcd.pause()
        await asyncio.sleep(freeze_s)
        cluster.etcd.resume()
    elif fault == "engine-freeze":
        target = cluster.engine_ids[-1]
        cluster.signal(target, signal.SIGSTOP)
        await asyncio.sleep(freeze_s)
        cluster.signal(target, signal.SIGCONT)
    else:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(ALL_FAULTS)}")
    return target, time.monotonic() - t0, 0.0
