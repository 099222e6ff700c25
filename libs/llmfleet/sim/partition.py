"""A simulation split across processes by instance: exact when dispatch does not read load.

When the dispatch policy is *load-blind* (``needs.load_blind``: round robin), where a request goes does
not depend on any instance's state, and instances share nothing else: each one's evolution depends only
on the requests routed to it. So the run is done in three steps, with the same objects as a serial run:

1. this process routes every request in arrival order (:meth:`Simulator.route`: the one dispatch
   object, the same calls in the same order as serially, predictions included);
2. the instances are split into ``workers`` groups balanced by routed requests, and each group is
   simulated in a forked process by the same :class:`Simulator` restricted to it, replaying the routes;
3. records (in arrival order), samples (summed per sampling instant, on a shared clock), instance
   statistics and event counts are merged.

Every record equals the serial run's (events at one instant are ordered by kind, never by insertion,
so each instance sees its events in the serial order); ``tests/sim/test_partition.py`` checks it. Not
partitionable — and run serially by :func:`simulate_partitioned` callers — are load-aware dispatchers,
dispatchers that hear completions (``FinishListener``), hooks and request moves: they couple instances.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait

from llmfleet.sim.records import RequestRecord
from llmfleet.sim.simulator import Route, Sample, SimResult, Simulator


def partition_blocker(sim: Simulator) -> str | None:
    """Why ``sim`` cannot be split across processes, or None when it can."""
    if not sim.fleet.load_blind:
        return f"dispatch policy {sim.dispatch.name!r} reads instance load ({sim.dispatch.needs.describe()})"
    coupled = sim.coupling()
    if coupled is not None:
        return coupled
    if len(sim.fleet.instances) < 2:
        return "only one instance"
    if "fork" not in mp.get_all_start_methods():
        return "this platform cannot fork"
    return None


def balanced_groups(counts: dict[str, int], instance_ids: Sequence[str], workers: int) -> list[list[str]]:
    """Split instances into at most ``workers`` non-empty groups, heaviest first onto the lightest
    group (LPT), each group in the simulator's instance order."""
    n = min(workers, len(instance_ids))
    load = [0] * n
    members: list[list[str]] = [[] for _ in range(n)]
    for iid in sorted(instance_ids, key=lambda i: (-counts.get(i, 0), i)):
        g = min(range(n), key=lambda j: (load[j], j))
        members[g].append(iid)
        load[g] += counts.get(iid, 0)
    order = {iid: k for k, iid in enumerate(instance_ids)}
    return [sorted(m, key=order.__getitem__) for m in members if m]


# RequestRecord's fields after the request's own six, in order (then ``content``, an input the
# parent does not need): a record is rebuilt as RequestRecord(<request fields>, *outcome); the
# tenant, priority and adapter, inputs too, ride along (tests/sim/test_partition.py checks the order)
OUTCOME_FIELDS = (
    "instance", "first_token_s", "finish_s", "produced", "solo_s", "preemptions", "moves", "requeues", "failed",
    "tenant", "priority", "adapter", "cached_tokens", "dispatched_s",
)  # fmt: skip


def auto_workers(n_requests: int, *, min_requests: int = 20_000, cap: int = 8) -> int:
    """Processes worth forking for ``n_requests``: one below ``min_requests`` (forking and routing
    upfront cost more than they save), else the CPUs this process may use, at most ``cap``."""
    if n_requests < min_requests:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, cap))


def _child(
    sim: Simulator, ids: list[str], reqs: list, routes: list[Route], origin: float, conn, done, clock, slot
):
    """Run one group (in a forked process) and send its result back."""
    try:
        sim.restrict(ids, routes, origin)

        def tick(n: int, now: float) -> None:
            done[slot] = n
            clock[slot] = now

        res = sim.run(reqs, total=len(reqs), progress=tick, strict_services=sim.fleet.strict_services)
        # the parent knows each request; only outcomes travel (plain tuples pickle ~10x faster)
        outcomes = [tuple(getattr(r, f) for f in OUTCOME_FIELDS) for r in res.records]
        res.records = []
        conn.send(("ok", (res, outcomes)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_partitioned(
    sim: Simulator,
    requests: Sequence,
    workers: int,
    *,
    progress: Callable[[int, float], None] | None = None,
    strict_services: bool = False,
) -> SimResult:
    """Run ``requests`` on ``sim`` split across up to ``workers`` processes (see the module docstring).

    Raises ``ValueError`` naming the reason when ``sim`` cannot be partitioned."""
    why = partition_blocker(sim)
    if why is not None:
        raise ValueError(f"cannot partition this simulation: {why}")
    t0 = time.perf_counter()
    reqs = list(requests)
    if not reqs:
        raise ValueError("the workload has no requests")
    if any(getattr(r, "follows", "") for r in reqs):
        raise ValueError("cannot partition this simulation: closed-loop turns arrive when others finish")
    routes = _route_all(sim, reqs, strict_services)  # step 1
    counts: dict[str, int] = {}
    for r in routes:
        if r.instance_id is not None:
            counts[r.instance_id] = counts.get(r.instance_id, 0) + 1
    groups = balanced_groups(counts, list(sim.fleet.instances), workers)
    owner = {iid: g for g, ids in enumerate(groups) for iid in ids}
    parts: list[tuple[list, list[Route]]] = [([], []) for _ in groups]
    for wr, r in zip(reqs, routes, strict=True):
        if r.instance_id is not None:
            part_reqs, part_routes = parts[owner[r.instance_id]]
            part_reqs.append(wr)
            part_routes.append(r)
    results = _fork(sim, groups, parts, reqs[0].arrival_s, progress)  # step 2
    return _merge(sim, reqs, routes, owner, groups, results, t0, progress)


def _route_all(sim: Simulator, reqs: list, strict_services: bool) -> list[Route]:
    """Route every request in arrival order, exactly as the serial run's arrivals would."""
    sim.fleet.use_services(strict_services)
    routes: list[Route] = []
    prev = None
    for wr in reqs:
        if prev is not None and wr.arrival_s < prev.arrival_s:
            raise ValueError(
                f"requests must be sorted by arrival: {wr.request_id} ({wr.arrival_s}) comes "
                f"after {prev.request_id} ({prev.arrival_s})"
            )
        routes.append(sim.route(wr, wr.arrival_s))
        prev = wr
    return routes


def _fork(
    sim: Simulator,
    groups: list[list[str]],
    parts: list[tuple[list, list[Route]]],
    origin: float,
    progress: Callable[[int, float], None] | None,
) -> dict[int, tuple[SimResult, list[tuple]]]:
    """One forked process per group with requests; their (result, outcomes) by group."""
    ctx = mp.get_context("fork")
    done = ctx.Array("q", len(groups), lock=False)  # per worker: requests arrived, simulated time
    clock = ctx.Array("d", len(groups), lock=False)
    procs, pending = [], dict[int, Connection]()
    for g, ids in enumerate(groups):
        part_reqs, part_routes = parts[g]
        if not part_reqs:
            continue
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_child, args=(sim, ids, part_reqs, part_routes, origin, send, done, clock, g), daemon=True
        )
        p.start()
        send.close()
        procs.append(p)
        pending[g] = recv
    results: dict[int, tuple[SimResult, list[tuple]]] = {}
    errors: list[str] = []
    try:
        while pending:
            ready = wait(list(pending.values()), timeout=0.5)
            for g, conn in [(g, c) for g, c in pending.items() if c in ready]:
                try:
                    status, payload = conn.recv()
                except EOFError:
                    status, payload = "error", f"worker {g} exited without a result"
                if status == "ok":
                    results[g] = payload
                else:
                    errors.append(payload)
                del pending[g]
            if progress:  # simulated time: the furthest behind of the workers still running
                progress(sum(done), min((clock[g] for g in pending), default=clock[0]))
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if errors:
        raise RuntimeError("a simulation worker failed:\n" + "\n".join(errors))
    return results


def _merge(sim, reqs, routes, owner, groups, payloads, t0, progress) -> SimResult:
    """Step 3: one result as the serial run would have produced it."""
    results: dict[int, SimResult] = {g: res for g, (res, _) in payloads.items()}
    outcomes = {g: iter(rows) for g, (_, rows) in payloads.items()}
    records: list[RequestRecord] = []
    for wr, r in zip(reqs, routes, strict=True):
        if r.instance_id is None:  # no instance could take it: failed at dispatch, as serially
            outcome: tuple = ()
            failed = r.failed or "no instance"
        else:  # it ran in a worker, which sent back its outcome fields (in field order)
            outcome, failed = next(outcomes[owner[r.instance_id]]), None
        rec = RequestRecord(wr.request_id, r.service.name, r.service.model, wr.arrival_s,
                            wr.prompt_tokens, wr.output_tokens, *outcome)  # fmt: skip
        if failed:
            rec.failed = failed
        records.append(rec)
    stats = {d["instance"]: d for res in results.values() for d in res.instances}
    idle = {  # an idle group (no results, or done sampling) holds no KV, no GPUs busy, no requests
        g: sum(sim.fleet.instances[i].kv_capacity_bytes for i in ids) for g, ids in enumerate(groups)
    }
    n_samples = max((len(res.samples) for res in results.values()), default=0)
    samples = []
    for k in range(n_samples):
        t = next(res.samples[k].t for res in results.values() if len(res.samples) > k)
        used = cap = active = inside = active_cap = mem_used = mem_cap = 0
        kinds: dict[tuple[tuple[str, ...], int], list[int]] = {}
        for g in range(len(groups)):
            res = results.get(g)
            if res is not None and len(res.samples) > k:
                s = res.samples[k]
                used += s.kv_used
                cap += s.kv_capacity
                active += s.active_gpus
                inside += s.in_system
                active_cap += s.active_kv_capacity
                mem_used += s.active_mem_used
                mem_cap += s.active_mem_capacity
                for models, tp, u, c in s.kinds:  # a kind may span groups: sum its KV
                    kind = kinds.setdefault((models, tp), [0, c])
                    kind[0] += u
                    kind[1] = max(kind[1], c)
            else:
                cap += idle[g]
        kv = tuple((m, tp, u, c) for (m, tp), (u, c) in sorted(kinds.items()) if u)
        samples.append(Sample(t, used, cap, active, inside, active_cap, kv, mem_used, mem_cap))
    unrouted = sum(1 for r in routes if r.instance_id is None)  # their arrival events ran here
    events = sum(res.events - len(res.samples) for res in results.values()) + n_samples + unrouted
    end_s = max((res.end_s for res in results.values()), default=reqs[-1].arrival_s)
    sim.records = records
    sim.events.now = end_s
    if progress:
        progress(len(reqs), end_s)
    return SimResult(
        records=records,
        samples=samples,
        instances=[stats.get(i) or sim.instance_stats(sim.fleet.instances[i]) for i in sim.fleet.instances],
        end_s=end_s,
        events=events,
        wall_s=time.perf_counter() - t0,
        cost_sources=sim.cost.sources(),
        provisioned_gpus=sum(i.tp for i in sim.fleet.instances.values()),
        workers=len(results),
        gpu_log=list(sim.fleet.gpu_log),
    )
