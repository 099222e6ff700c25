"""Periodic placement inside a simulation: the placement leader's loop, run by the simulator.

Every interval a :class:`PlacementLoop` tick

1. measures each service over the last ``window_s`` as the live service monitor does
   (:func:`window_loads`: arrival rate and prompt lengths from arrivals, output lengths, SLO attainment
   and normalized latency from the requests finished in the window);
2. calls the planner with a :class:`PlacementContext` (the plan in force, a plan evaluator over the
   window's requests for planners that need one, per-model counts of requests best-fit dispatch found
   no feasible worker for);
3. maps the plan onto the instances with :func:`~llmfleet.policies.placement.assign_plan` (the live
   leader's function: fewest model moves; engines left without models are retired, GPUs still free get
   new instances) and applies it with ``set_models`` / ``retire_instance`` / ``add_instance``
   (:mod:`llmfleet.sim.fleet`: loads take ``weight bytes / host link`` time, removed models' requests
   move or drain, nothing is lost);
4. logs a :class:`Decision`. As in the live leader, a :class:`PlacementInfeasible` plan (or a
   ValueError: an instance that would not hold its models) keeps the plan in force and logs the error,
   and ``confirm_intervals`` > 1 applies a changed plan only once proposed that many ticks in a row.

Requests that wait count as demand, as in the live leader: each service's requests not
started at the tick (waiting for capacity in the simulator, or queued on an instance) are added to its
rate by :func:`~llmfleet.policies.placement.backlog.with_backlog` (served within one interval). A
request for a model no instance serves, or the first request held because every instance of its model
is saturated (late binding), wakes the loop (``Simulator.wake``): it ticks at once, as the live leader
does when a scheduler reports such requests, at most once per ``WAKE_GAP_S``.

With an ``adaptive`` controller (SeaLLM Eq. 8, ``AdaptiveInterval``) the next tick comes after
``adaptive.next_interval(M_real, M_est)``: M_real measured over the interval that just ended, M_est the
planner's estimate for it (its ``last_score`` when it gave one, else the previous estimate), with
M = SLO attainment / normalized latency (``adaptive_interval.performance``).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
from llmfleet.policies.placement import (
    EngineSlot,
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementInfeasible,
    PlacementPlanner,
    PlanEvaluator,
    ServiceLoad,
    assign_plan,
    gpus_in_use,
    moves,
)
from llmfleet.policies.placement.adaptive_interval import performance
from llmfleet.policies.placement.backlog import with_backlog
from llmfleet.policies.placement.hysteresis import Hysteresis, grows_for, newly_served
from llmfleet.sim.metrics import slo_met
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import SimSpec
from llmfleet.workload import WorkloadRequest

EvaluatorFactory = Callable[[SimSpec, list[WorkloadRequest], float], PlanEvaluator]
WAKE_GAP_S = 1.0  # a woken tick comes at most this often (the live reporter's cadence)


class _Skip(ValueError):
    """Nothing to plan from this tick (the plan in force stays)."""


class IntervalController(Protocol):
    """Chooses the next placement interval (SeaLLM's adaptive replacement, Eq. 8)."""

    @property
    def interval_s(self) -> float: ...

    def next_interval(self, m_real: float | None, m_est: float | None) -> float: ...


@dataclass
class Decision:
    """One placement tick: what was decided (or why the plan in force was kept)."""

    t: float
    plan: str  # summary of the plan in force after the tick
    gpus_in_use: int  # GPUs of the plan in force after the tick
    moves: int = 0  # models loaded + unloaded (proposed ones, when held back)
    changes: list[str] = field(default_factory=list)  # per instance: "+model", "-model", new, retired
    status: str = "applied"  # applied | unchanged | proposed (hysteresis) | infeasible | skipped
    next_interval_s: float = 0.0
    reason: str = ""  # the planner's explanation, when it gives one
    error: str = ""  # why the plan was not applied ("" = applied)
    m_real: float | None = None
    m_est: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_summary(plan: Sequence[InstancePlan]) -> str:
    """``"2×tp1[llama2-7b] + tp2[llama2-13b+llama2-7b]"``."""
    groups: dict[tuple[int, tuple[str, ...]], int] = {}
    for p in plan:
        key = (p.tp, tuple(sorted(p.models)))
        groups[key] = groups.get(key, 0) + 1
    parts = [
        f"{n}×tp{tp}[{'+'.join(ms)}]" if n > 1 else f"tp{tp}[{'+'.join(ms)}]"
        for (tp, ms), n in sorted(groups.items())
    ]
    return " + ".join(parts) or "(none)"


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std())


def _quality(finished: Sequence[RequestRecord], spec: SimSpec) -> tuple[float, float] | None:
    """(SLO attainment, mean normalized latency) of finished (done or failed) requests; None if none.
    L̂_s is the mean execution time alone of the service's requests among them."""
    if not finished:
        return None
    slo = {s.name: s.slo for s in spec.services}
    solo: dict[str, list[float]] = {}
    for r in finished:
        if r.solo_s > 0:
            solo.setdefault(r.service, []).append(r.solo_s)
    mean_solo = {k: float(np.mean(v)) for k, v in solo.items()}
    met = sum(1 for r in finished if slo_met(r, slo[r.service]))
    norm = [r.latency_s / mean_solo[r.service] for r in finished if r.done and r.service in mean_solo]
    return met / len(finished), float(np.mean(norm)) if norm else math.inf


def measured_m(finished: Sequence[RequestRecord], spec: SimSpec) -> float | None:
    """M = SLO attainment / normalized latency over ``finished`` (None when nothing finished)."""
    q = _quality(finished, spec)
    if q is None:
        return None
    attained, norm = q
    return 0.0 if not math.isfinite(norm) else performance(attained, max(norm, 1e-12))


def window_loads(
    spec: SimSpec,
    arrived: Sequence[RequestRecord],
    finished: Sequence[RequestRecord],
    span_s: float,
    last_output: dict[str, tuple[float, float]] | None = None,
) -> list[ServiceLoad]:
    """Each service's demand over a window of ``span_s`` seconds: rate and prompt lengths from the
    requests ``arrived`` in it, output lengths (else ``last_output``'s), attainment and normalized
    latency from those ``finished`` in it (done, or failed) — what a service monitor can measure."""
    span = max(span_s, 1e-9)
    out = []
    for s in spec.services:
        arr = [r for r in arrived if r.service == s.name]
        fin = [r for r in finished if r.service == s.name]
        done = [r.output_tokens for r in fin if r.done]
        p_mean, p_std = _mean_std([r.prompt_tokens for r in arr])
        if done:
            o_mean, o_std = _mean_std(done)
            if last_output is not None:
                last_output[s.name] = (o_mean, o_std)
        else:
            o_mean, o_std = (last_output or {}).get(s.name, (0.0, 0.0))
        q = _quality(fin, spec)
        out.append(
            ServiceLoad(
                s.name, s.model, len(arr) / span, p_mean, o_mean, p_std, o_std, s.slo,
                attainment=q[0] if q else None,
                normalized_latency=q[1] if q and math.isfinite(q[1]) else None,
                adapter=s.adapter,
            )
        )  # fmt: skip
    return out


class PlacementLoop:
    """Run ``planner`` every ``interval_s`` (or the ``adaptive`` controller's interval) over the last
    ``window_s`` (default: the interval) of the simulated workload; see the module docstring.

    ``mode`` is how removed models' requests leave ("move" to other hosts where possible, or "drain").
    ``confirm_intervals`` is the live leader's hysteresis: a changed plan is applied once proposed that
    many ticks in a row (1: at once), or at once when it serves a model the plan in force does not.
    ``evaluator_factory(spec, recent requests, now)`` builds the plan evaluator for planners whose
    ``needs.evaluator`` is set (its ``close()``, if any, is called after the tick)."""

    def __init__(
        self,
        planner: PlacementPlanner,
        gpus: GpuPool,
        interval_s: float,
        window_s: float | None = None,
        evaluator_factory: EvaluatorFactory | None = None,
        adaptive: IntervalController | None = None,
        *,
        mode: str = "move",
        confirm_intervals: int = 1,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"the placement interval must be > 0 s, got {interval_s}")
        if window_s is not None and not window_s > 0:
            raise ValueError(f"the placement window must be > 0 s, got {window_s}")
        if mode not in ("move", "drain"):
            raise ValueError(f"mode must be 'move' or 'drain', got {mode!r}")
        if confirm_intervals < 1:
            raise ValueError(f"confirm_intervals must be >= 1, got {confirm_intervals}")
        if planner.needs.evaluator and evaluator_factory is None:
            raise ValueError(
                f"placement {planner.name!r} scores plans by simulation: give an evaluator_factory"
            )
        self.planner = planner
        self.gpus = gpus
        self.interval_s = float(interval_s)
        self.window_s = float(window_s if window_s is not None else interval_s)
        self.evaluator_factory = evaluator_factory
        self.adaptive = adaptive
        self.mode = mode
        self.confirm_intervals = confirm_intervals
        self.hysteresis = Hysteresis(confirm_intervals)  # the live leader's rule
        self.decisions: list[Decision] = []
        self._start = 0.0
        self._last = 0.0  # the previous tick
        self._cursor = 0  # records before it finished before the window of the last tick
        self._m_est: float | None = None
        self._infeasible_seen: dict[str, int] = {}
        self._last_output: dict[str, tuple[float, float]] = {}
        self._ticks = 0
        self._gen = 0  # the scheduled tick's generation: a wake-up supersedes the pending one
        self._sim: Simulator | None = None

    def install(self, sim: Simulator, start: float) -> None:
        """Tick first at ``start`` + the first interval (``start``: the workload's first arrival)."""
        self._start = self._last = start
        self._m_est = self._score_m()
        first = self.adaptive.interval_s if self.adaptive is not None else self.interval_s
        self._sim = sim
        sim.fleet.wake = self.wake
        sim.at(start + first, self._scheduled(self._gen))

    def _scheduled(self, gen: int) -> Callable[[Simulator, float], None]:
        def fire(sim: Simulator, now: float) -> None:
            if gen == self._gen:  # not superseded by a wake-up
                self.tick(sim, now)

        return fire

    def wake(self, now: float) -> None:
        """Requests wait for a model no instance serves: tick now (the next one an interval later)."""
        if self._sim is None or (self._ticks and now - self._last < WAKE_GAP_S):
            return
        self._gen += 1
        self._sim.at(now, self._scheduled(self._gen))

    def _score_m(self) -> float | None:
        score = self.planner.last_score
        if score is None or not score.requests:
            return self._m_est
        if not score.normalized_latency > 0:
            return self._m_est
        return performance(score.slo_attainment, score.normalized_latency)

    # ------------------------------------------------------------------------------------- one tick
    def _window(self, sim: Simulator, now: float):
        """(arrived in the window, finished in it, finished since the last tick, its length); the
        window is (now − window_s, now], from the loop's start at most."""
        recs = sim.records
        lo = max(now - self.window_s, self._start)
        first = min(lo, self._last)
        while self._cursor < len(recs):  # skip requests finished (or failed) before both windows
            r = recs[self._cursor]
            ended = r.finish_s if r.done else (r.arrival_s if r.failed else None)
            if ended is None or ended > first:
                break
            self._cursor += 1
        arrived = recs[bisect.bisect_right(recs, lo, lo=self._cursor, key=lambda r: r.arrival_s) :]
        finished, recent = [], []
        for r in recs[self._cursor :]:
            ended = r.finish_s if r.done else (r.arrival_s if r.failed else None)
            if ended is None or ended > now:
                continue
            if ended > lo:
                finished.append(r)
            if ended > self._last:
                recent.append(r)
        return arrived, finished, recent, now - lo

    def tick(self, sim: Simulator, now: float) -> Decision:
        """Measure, plan, apply; schedule the next tick while the simulation has work."""
        self._ticks += 1
        arrived, finished, recent, span = self._window(sim, now)
        m_real = measured_m(recent, sim.spec)
        m_est = self._m_est
        interval = (
            self.adaptive.next_interval(m_real, m_est) if self.adaptive is not None else self.interval_s
        )
        loads = with_backlog(
            self._queued(sim, window_loads(sim.spec, arrived, finished, span, self._last_output), now),
            self.interval_s,
        )
        hosting = sim.fleet.hosting()
        current = tuple(InstancePlan(i, ms, tp) for i, (tp, ms) in sorted(hosting.items()) if ms)
        infeasible = {m: n - self._infeasible_seen.get(m, 0) for m, n in sim.fleet.infeasible.items()}
        self._infeasible_seen = dict(sim.fleet.infeasible)
        evaluator = None
        decision: Decision
        try:
            if self.planner.needs.evaluator:
                requests = [
                    WorkloadRequest(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.service, r.model)
                    for r in arrived
                ]  # fmt: skip
                if not requests:
                    raise _Skip("no arrivals in the window to simulate plans on")
                assert self.evaluator_factory is not None
                evaluator = self.evaluator_factory(sim.spec, requests, now)
            context = PlacementContext(
                current=current,
                evaluator=evaluator,
                now=now,
                infeasible={m: n for m, n in infeasible.items() if n},
            )
            plan = self.planner.place(self.gpus, loads, context)
            backlogged = {s.model for s in loads if s.held}
            decision = self._decide(sim, plan, hosting, now, backlogged)
        except (PlacementInfeasible, ValueError) as e:  # as the live leader: log, keep the plan in force
            status = "skipped" if isinstance(e, _Skip) else "infeasible"
            decision = Decision(now, plan_summary(current), sim.fleet.gpus_used, status=status, error=str(e))
        finally:
            if evaluator is not None:
                evaluator.close()
        if decision.status in ("applied", "unchanged"):
            self._m_est = self._score_m()
        decision.next_interval_s = interval
        decision.reason = self.planner.last_reason
        decision.m_real, decision.m_est = m_real, m_est
        self.decisions.append(decision)
        self._last = now
        if not sim.finished:
            self._gen += 1
            sim.at(now + interval, self._scheduled(self._gen))
        return decision

    def _queued(self, sim: Simulator, loads: list[ServiceLoad], now: float) -> list[ServiceLoad]:
        """``loads`` with each service's requests not started at ``now`` (waiting or queued)."""
        queued: dict[str, int] = {}
        for r in sim.records[self._cursor :]:
            if r.first_token_s is None and not r.failed and r.arrival_s <= now:
                queued[r.service] = queued.get(r.service, 0) + 1
        held = sim.fleet.held()
        return [dataclasses.replace(s, queued=queued.get(s.name, 0), held=held.get(s.name, 0)) for s in loads]

    def _decide(
        self,
        sim: Simulator,
        plan: Sequence[InstancePlan],
        hosting: dict[str, tuple[int, tuple[str, ...]]],
        now: float,
        backlogged: set[str] | frozenset[str] = frozenset(),
    ) -> Decision:
        """Map ``plan`` onto the instances (existing ones first, new ones for the rest: assign_plan) and
        apply it, unless hysteresis holds it back."""
        used = sum(p.tp for p in plan)
        if used > sim.spec.cluster.count:
            raise PlacementInfeasible(f"the plan uses {used} GPUs, the cluster has {sim.spec.cluster.count}")
        pool = [EngineSlot(iid, tp, ms) for iid, (tp, ms) in sorted(hosting.items())]
        current = {e.engine_id: e.models for e in pool}
        wanted: dict[int, int] = {}
        for p in plan:
            wanted[p.tp] = wanted.get(p.tp, 0) + 1
        fresh: list[str] = []
        for tp, n in sorted(wanted.items()):
            for j in range(n):
                eid = f"n{self._ticks}.{tp}.{j}"
                while eid in sim.fleet.instances:
                    eid += "'"
                fresh.append(eid)
                pool.append(EngineSlot(eid, tp))
        target = assign_plan(plan, pool)  # PlacementInfeasible when the pool lacks engines of some size
        tps = {e.engine_id: e.tp for e in pool}
        after = [InstancePlan(eid, ms, tps[eid]) for eid, ms in sorted(target.items()) if ms]
        summary, gpus = plan_summary(after), gpus_in_use(target, pool)
        n_moves = moves(current, target)
        if n_moves == 0:
            self.hysteresis.reset()
            return Decision(now, summary, gpus, status="unchanged")
        for eid, ms in target.items():  # every instance must hold its models before any change
            if ms:
                sim.fleet.check_models(ms, tps[eid], f"instance {eid}")  # ValueError (DoesNotFit)
        # hysteresis, as the live leader: the same proposal confirm_intervals ticks in a row, unless it
        # serves a model the plan in force leaves unserved
        key = (
            tuple(sorted((e, tuple(sorted(ms))) for e, ms in target.items() if e not in fresh)),
            tuple(sorted((tps[e], tuple(sorted(target[e]))) for e in fresh if target[e])),
        )
        urgent = bool(newly_served(current, target) or grows_for(current, target, backlogged))
        if not self.hysteresis.decide(key, urgent=urgent):
            note = f"proposed {summary}; applied if proposed for {self.confirm_intervals} intervals"
            return Decision(now, plan_summary([InstancePlan(e, ms, tps[e]) for e, ms in current.items() if ms]),
                            sim.fleet.gpus_used, n_moves, [note], status="proposed")  # fmt: skip
        changes = []
        for eid, ms in sorted(target.items()):
            if eid in fresh or set(ms) == set(current[eid]):
                continue
            before = set(current[eid])
            sim.fleet.set_models(eid, ms, now, mode=self.mode)
            if ms:
                delta = [f"+{m}" for m in ms if m not in before] + [f"-{m}" for m in sorted(before - set(ms))]
                changes.append(f"{eid}: {' '.join(delta)}")
            else:
                changes.append(f"{eid}: retired")
        for eid in fresh:
            ms = target[eid]
            if ms:
                sim.fleet.add_instance(
                    InstancePlan(eid, ms, tps[eid]), now + sim.fleet.load_time_s(ms, tps[eid])
                )
                changes.append(f"{eid}: new tp{tps[eid]} [{'+'.join(ms)}]")
        return Decision(now, summary, gpus, n_moves, changes, status="applied")
