"""Capacity by replay: the fewest workers that serve a workload within its SLO, and Aladdin's Eq. 7 fit.

:func:`workers_needed` replays ``workload`` on k identical workers (``tp`` GPUs each, one model) for
k found by :func:`fewest_passing` (halving or doubling from a guess, then bisection) and returns the smallest k whose SLO attainment (the
``slo`` definition of :mod:`llmfleet.sim.metrics`: ``aladdin``, ``seallm`` or ``uellm``) reaches
``target``. Attainment is assumed monotone in k (more workers never hurt: true for the dispatch
policies here up to simulation noise; the bisection returns the smallest k it saw meet the target).

:func:`fit_worker_scaler` is Aladdin §5.2: replay best-fit placement offline at several arrival rates,
then fit N_w = ⌈k5·r + c5⌉ by least squares (:class:`AladdinLinearScaler`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.scaling.aladdin_linear import AladdinLinearScaler
from llmfleet.sim.run import PolicyBundle, simulate
from llmfleet.sim.simulator import Predict
from llmfleet.sim.spec import ClusterSpec, SimSpec
from llmfleet.workload import Workload


@dataclass(frozen=True)
class CapacityPoint:
    workers: int  # the fewest that met the target (None-like 0 when even max_workers did not)
    gpus: int
    attainment: float  # at ``workers``
    simulations: int


def attainment_with(
    spec: SimSpec,
    workload: Workload,
    bundle: PolicyBundle,
    model: str,
    tp: int,
    workers: int,
    slo: str,
    predict: Predict | None = None,
) -> float:
    """SLO attainment of ``workload`` on ``workers`` instances of ``model`` at ``tp`` GPUs each."""
    plan = [InstancePlan(f"{model}-{i}", (model,), tp) for i in range(workers)]
    big = SimSpec(
        ClusterSpec(max(spec.cluster.count, tp * workers), spec.cluster.hw), spec.services, spec.engine
    )
    e = simulate(big, workload, bundle, plan=plan, samples=1, predict=predict)
    value = e.report["overall"]["slo"].get(slo)
    if value is None:
        raise ValueError(f"the services set no {slo!r} SLO; valid here: {sorted(e.report['overall']['slo'])}")
    return float(value)


def fewest_passing(ok: Callable[[int], bool], guess: int = 1, cap: int = 256) -> int | None:
    """The smallest n in [1, cap] with ``ok(n)``, assuming ``ok`` is monotone: from ``guess``, halve
    while it passes or double while it fails, then bisect. None when even ``cap`` fails."""
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    n = min(max(1, guess), cap)
    if ok(n):
        lo, hi = 0, n
        while hi > 1:
            m = max(1, hi // 2)
            if not ok(m):
                lo = m
                break
            hi = m
    else:
        lo, hi = n, 0
        while not hi:
            if lo >= cap:
                return None
            m = min(cap, lo * 2)
            if ok(m):
                hi = m
            else:
                lo = m
    while hi - lo > 1:
        m = (lo + hi) // 2
        if ok(m):
            hi = m
        else:
            lo = m
    return hi


def workers_needed(
    spec: SimSpec,
    workload: Workload,
    bundle: PolicyBundle,
    *,
    model: str,
    tp: int,
    target: float,
    slo: str = "aladdin",
    max_workers: int = 256,
    start: int = 1,
    predict: Predict | None = None,
) -> CapacityPoint:
    """The fewest workers meeting ``target`` attainment (see the module docstring)."""
    if not 0 < target <= 1:
        raise ValueError(f"target must be in (0, 1], got {target}")
    seen: dict[int, float] = {}

    def att(k: int) -> float:
        if k not in seen:
            seen[k] = attainment_with(spec, workload, bundle, model, tp, k, slo, predict)
        return seen[k]

    n = fewest_passing(lambda k: att(k) >= target, start, max_workers)
    if n is None:
        return CapacityPoint(0, 0, att(max_workers), len(seen))
    return CapacityPoint(n, n * tp, att(n), len(seen))


def fit_worker_scaler(
    rates: Sequence[float],
    workload_at: Callable[[float], Workload],
    needed: Callable[[Workload], int],
    *,
    min_rate: float = 0.0,
    min_workers: int = 1,
) -> tuple[AladdinLinearScaler, list[tuple[float, int]]]:
    """Replay at each rate (``needed(workload_at(rate))`` workers) and fit Eq. 7; returns the scaler and
    the (rate, workers) points it was fitted on."""
    points = [(float(r), int(needed(workload_at(r)))) for r in rates]
    scaler = AladdinLinearScaler(min_rate=min_rate, min_workers=min_workers)
    scaler.fit([r for r, _ in points], [w for _, w in points])
    return scaler, points
