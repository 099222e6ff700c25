"""Capacity by replay: the fewest workers that serve a workload within its SLO, and Aladdin's Eq. 7 fit.

:func:`workers_needed` replays ``workload`` on k identical workers (``tp`` GPUs each, one model) for
k found by :func:`fewest_passing` (halving or doubling from a guess, then bisection) and returns the
smallest k whose SLO attainment (the ``slo`` definition of :mod:`llmfleet.sim.metrics`: ``aladdin``,
``seallm`` or ``uellm``) reaches ``target``. Attainment is assumed monotone in k (more workers never
hurt: true for the dispatch policies here up to simulation noise; the bisection returns the smallest k
it saw meet the target).

A count that misses the target is known as soon as so many requests missed their SLO that the
attainment cannot reach it any more: its replay stops there (``Simulator.run``'s ``stop``), which
at P100 is the first miss. A count that meets the target runs to its end, so the answer's attainment
is the whole replay's; only a search where even ``max_workers`` misses replays that count once more
to the end for its attainment. The answer is the one whole replays give (``tests/sim/test_capacity.py``).

:func:`fit_worker_scaler` is Aladdin §5.2: replay best-fit placement offline at several arrival rates,
then fit N_w = ⌈k5·r + c5⌉ by least squares (:class:`AladdinLinearScaler`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.scaling.aladdin_linear import AladdinLinearScaler
from llmfleet.sim.metrics import SLO_KINDS
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.run import PolicyBundle, simulate
from llmfleet.sim.simulator import Predict
from llmfleet.sim.spec import ClusterSpec, SimSpec
from llmfleet.workload import Workload


@dataclass(frozen=True)
class CapacityPoint:
    workers: int  # the fewest that met the target (None-like 0 when even max_workers did not)
    gpus: int
    attainment: float  # at ``workers`` (at ``max_workers`` when even it missed), the whole replay's
    simulations: int  # replays run, those stopped early included


def attainment_with(
    spec: SimSpec,
    workload: Workload,
    bundle: PolicyBundle,
    model: str,
    tp: int,
    workers: int,
    slo: str,
    predict: Predict | None = None,
    stop_below: float | None = None,
) -> float | None:
    """SLO attainment of ``workload`` on ``workers`` instances of ``model`` at ``tp`` GPUs each.

    ``stop_below``: stop the replay at the completion after which the attainment is sure to end below
    it (its misses so far already put it there) and answer None; a replay that does not stop answers
    its attainment. It stops only when every service sets ``slo`` (every request then counts)."""
    plan = [InstancePlan(f"{model}-{i}", (model,), tp) for i in range(workers)]
    big = SimSpec(
        ClusterSpec(max(spec.cluster.count, tp * workers), spec.cluster.hw), spec.services, spec.engine
    )
    stop = _below(spec, workload, slo, stop_below) if stop_below is not None else None
    e = simulate(big, workload, bundle, plan=plan, samples=1, predict=predict, stop=stop)
    if e.report.get("stopped_s") is not None:
        return None
    value = e.report["overall"]["slo"].get(slo)
    if value is None:
        raise ValueError(f"the services set no {slo!r} SLO; valid here: {sorted(e.report['overall']['slo'])}")
    return float(value)


def _below(
    spec: SimSpec, workload: Workload, slo: str, target: float
) -> Callable[[RequestRecord], bool] | None:
    """``stop`` for a replay that only needs to know whether ``slo``'s attainment reaches ``target``:
    True once the misses among the completed requests put it below for good (None: some service does
    not set ``slo``, so which requests count is the report's to say)."""
    kind = SLO_KINDS.get(slo)
    slos = {s.name: s.slo for s in spec.services}
    if kind is None or not all(kind.sets(x) for x in slos.values()):
        return None
    n = len(workload.requests)
    misses = 0

    def below(r: RequestRecord) -> bool:
        nonlocal misses
        if not (r.done and kind.met(r, slos[r.service])):
            misses += 1
        return (n - misses) / n < target  # the attainment if every other request met it

    return below


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
    seen: dict[int, float | None] = {}  # None: the replay stopped below the target

    def att(k: int) -> float | None:
        if k not in seen:
            seen[k] = attainment_with(spec, workload, bundle, model, tp, k, slo, predict, stop_below=target)
        return seen[k]

    def ok(k: int) -> bool:
        a = att(k)
        return a is not None and a >= target

    n = fewest_passing(ok, start, max_workers)
    if n is None:
        whole = seen[max_workers]
        if whole is None:  # its attainment, replayed to the end
            whole = attainment_with(spec, workload, bundle, model, tp, max_workers, slo, predict)
        return CapacityPoint(0, 0, cast(float, whole), len(seen) + (seen[max_workers] is None))
    return CapacityPoint(n, n * tp, cast(float, att(n)), len(seen))


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
