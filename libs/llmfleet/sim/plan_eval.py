"""Score candidate placement plans by simulating the recent workload (SeaLLM's SimulateUI and
SimulatePerformance): the :class:`~llmfleet.policies.placement.PlanEvaluator` the simulator's
placement loop and the live placement leader hand to planners that need one.

Each plan runs through the ordinary :class:`~llmfleet.sim.simulator.Simulator` with the deployment's
engine policy and dispatch (a :class:`~llmfleet.sim.run.PolicyBundle`) on the spec's hardware and
costs. Score (:class:`~llmfleet.policies.placement.PlanScore`):

* a served request meets its SLO when it meets every objective its service sets: latency ≤
  ``latency_scale`` × its execution time alone (SeaLLM), TTFT/TPOT (Aladdin) and the deadline (UELLM);
* L̂_s = the mean execution time alone of the service's requests (the smallest TP group that holds its
  model prices the requests no instance of the plan serves);
* a request no instance can take is a violation; its latency counts from its arrival to the end of the
  simulated window (the last arrival or finish, whichever is later).

:class:`ClusterPlanEvaluators` is the :class:`~llmfleet.policies.placement.evaluator.PlanEvaluatorFactory`
the live placement leader is given: it turns a cluster config, the GPU pool and the monitored window
into a :class:`SimPlanEvaluator`, as ``llmfleet sim --cluster-config`` reads that config.

:class:`PlanWorkers` with ``processes`` > 1 simulates the plans of one :meth:`~SimPlanEvaluator.evaluate`
call side by side in that many worker processes ("spawn", so that a process with gRPC threads can use
them safely). The workers outlive the evaluators that use them: a placement loop makes an evaluator
per tick (each on its own window of requests), and spawning processes per tick cost more CPU than the
searches they ran in parallel. Each evaluator's workload travels pickled with its tasks; a worker
builds a scorer for the latest workload it was sent and keeps it while the tasks keep naming it.

**Plans by component.** With a dispatch policy whose choices for a model depend only on the instances
hosting that model and on its own state for that model (``needs.per_model``: JSQ, round robin), and no LoRA
adapters, the instances of a plan fall into components that share nothing: instances are linked when
they host a common model, and a request only ever reaches the instances of its model. Each component's
evolution depends only on its own requests (events at one instant are ordered by kind, then by their
order of insertion, which the component's own events keep), so a plan is simulated component by
component, each on its requests, and the records are put back in arrival order: every record, and so
the score, equals the whole plan's simulation (``tests/sim/test_plan_eval.py`` checks it).
A component's records are kept for the evaluator's life: a search that changes one group of a plan
(Algorithm 1 adds one service per step) simulates only the component that group belongs to again.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import pickle
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from llmfleet.costmodel import ProfileRecord
from llmfleet.costmodel.hardware import hardware
from llmfleet.policies.dispatch import make_dispatch_policy
from llmfleet.policies.placement.base import GpuPool, InstancePlan, PlanScore
from llmfleet.policies.placement.evaluator import WindowRequest
from llmfleet.sim.cost import CostBook
from llmfleet.sim.metrics import slo_met
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.run import PolicyBundle
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import ClusterSpec, SimSpec, from_cluster_config
from llmfleet.workload import WorkloadRequest

if TYPE_CHECKING:
    from llmfleet.config import ClusterConfig

log = logging.getLogger(__name__)


def components(plan: Sequence[InstancePlan]) -> list[tuple[InstancePlan, ...]]:
    """The plan's instances grouped by the models they share (linked when they host a common model),
    each group in plan order, the groups in the order of their first instance."""
    parent = list(range(len(plan)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, p in enumerate(plan):
        for m in p.models:
            j = first.setdefault(m, i)
            a, b = root(i), root(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[InstancePlan]] = {}
    for i, p in enumerate(plan):
        groups.setdefault(root(i), []).append(p)
    return [tuple(g) for g in groups.values()]


class _Scorer:
    """Everything one process needs to simulate a plan (built once per process), and the records of
    the plan components it simulated (see the module docstring)."""

    def __init__(
        self,
        spec: SimSpec,
        requests: Sequence[WorkloadRequest],
        bundle: PolicyBundle,
        records: Sequence[ProfileRecord],
    ) -> None:
        self.spec = spec
        self.requests = list(requests)
        self.bundle = bundle
        self.cost = CostBook.build(spec.cluster.hw, spec.archs(), records, spec.cost_source)
        self.min_tp = spec.reference_tps()
        model = {s.name: s.model for s in spec.services}
        self.model_of = [model[r.service] for r in self.requests]
        self.by_model = {
            m: np.array([i for i, x in enumerate(self.model_of) if x == m], dtype=np.int64)
            for m in sorted(set(self.model_of))
        }
        dispatch = make_dispatch_policy(bundle.dispatch.policy, **bundle.dispatch.options)
        self.split = dispatch.needs.per_model and not spec.adapters
        self.known = frozenset(spec.archs())
        self.parts: dict[tuple[InstancePlan, ...], list[RequestRecord]] = {}  # a component's records

    def _simulate(
        self, plan: Sequence[InstancePlan], requests: Sequence[WorkloadRequest]
    ) -> list[RequestRecord]:
        sim = Simulator(
            self.spec, list(plan), self.bundle.local_factory(),
            make_dispatch_policy(self.bundle.dispatch.policy, **self.bundle.dispatch.options), self.cost,
        )  # fmt: skip
        return sim.run(requests, strict_services=True).records

    def _unserved(self, i: int) -> RequestRecord:
        r = self.requests[i]
        return RequestRecord(r.request_id, r.service, self.model_of[i], r.arrival_s, r.prompt_tokens,
                             r.output_tokens, failed="no instance")  # fmt: skip

    def records(self, plan: Sequence[InstancePlan]) -> list[RequestRecord]:
        """Every request's record under ``plan``, in arrival order (component by component when the
        dispatch allows it; see the module docstring)."""
        if not plan:
            return [self._unserved(i) for i in range(len(self.requests))]
        if not self.split:
            return self._simulate(plan, self.requests)
        unknown = sorted({m for p in plan for m in p.models} - self.known)
        if unknown:  # what the whole plan's simulation says (an instance idle in a component is not run)
            raise ValueError(f"the plan hosts {unknown}, which no service uses")
        out: list[RequestRecord | None] = [None] * len(self.requests)
        for comp in components(plan):
            models = {m for p in comp for m in p.models}
            idx = np.sort(np.concatenate([self.by_model.get(m, np.empty(0, np.int64)) for m in models]))
            if not len(idx):
                continue  # no request reaches these instances
            recs = self.parts.get(comp)
            if recs is None:
                recs = self.parts[comp] = self._simulate(comp, [self.requests[i] for i in idx.tolist()])
            for i, rec in zip(idx.tolist(), recs, strict=True):
                out[i] = rec
        return [rec if rec is not None else self._unserved(i) for i, rec in enumerate(out)]

    def score(self, plan: Sequence[InstancePlan]) -> PlanScore:
        spec, svc = self.spec, {s.name: s for s in self.spec.services}
        records = self.records(plan)
        end = max(
            [r.arrival_s for r in records] + [r.finish_s for r in records if r.finish_s is not None],
            default=0.0,
        )
        for r in records:
            if not r.done and r.solo_s <= 0:
                r.solo_s = self.cost.solo_time(
                    r.model, self.min_tp[r.model], r.prompt_tokens, r.output_tokens
                )
        solo_sum: dict[str, float] = {}
        count: dict[str, int] = {}
        for r in records:
            solo_sum[r.service] = solo_sum.get(r.service, 0.0) + r.solo_s
            count[r.service] = count.get(r.service, 0) + 1
        mean_solo = {s: solo_sum[s] / count[s] for s in count}
        violations = {s.name: 0 for s in spec.services}
        latency_sum = {s.name: 0.0 for s in spec.services}
        met = 0
        for r in records:
            latency = r.latency_s if r.done else end - r.arrival_s
            latency_sum[r.service] += latency / mean_solo[r.service] if mean_solo[r.service] > 0 else 0.0
            if slo_met(r, svc[r.service].slo):
                met += 1
            else:
                violations[r.service] += 1
        n = len(records)
        return PlanScore(
            slo_attainment=met / n if n else 1.0,
            normalized_latency=sum(latency_sum.values()) / n if n else 0.0,
            violations=violations,
            latency_sum=latency_sum,
            requests=n,
        )


_WORKER: tuple[int, _Scorer] | None = None  # in a worker process: (workload key, its scorer)


def _score_in_worker(key: int, workload: bytes, plan: list[InstancePlan]) -> PlanScore:
    global _WORKER
    if _WORKER is None or _WORKER[0] != key:
        _WORKER = (key, _Scorer(*pickle.loads(workload)))
    return _WORKER[1].score(plan)


class PlanWorkers:
    """``processes`` worker processes scoring plans for one :class:`SimPlanEvaluator` after another
    (see the module docstring); spawned at the first parallel evaluation. With ``processes`` = 1 the
    evaluators score in the calling process. Use as a context manager or call :meth:`close`."""

    def __init__(self, processes: int = 1) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None

    def score(self, key: int, workload: bytes, plans: Sequence[Sequence[InstancePlan]]) -> list[PlanScore]:
        """Each plan's score on ``workload`` (a pickled scorer's arguments, named by ``key``). A pool
        that lost a worker (killed, out of memory) is replaced, and the plans scored again once."""
        n = len(plans)
        args = ([key] * n, [workload] * n, [list(p) for p in plans])
        retried = False
        while True:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.processes, multiprocessing.get_context("spawn"))
            try:
                return list(self._pool.map(_score_in_worker, *args))
            except BrokenProcessPool:
                self.close()
                if retried:
                    raise
                retried = True
                log.warning("a plan worker process died; the workers are spawned again")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> PlanWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_KEYS = itertools.count()  # one per evaluator: what a worker's scorer was built for


class SimPlanEvaluator:
    """A :class:`PlanEvaluator` that simulates ``requests`` (arrival-ordered, labelled with the spec's
    services) under each plan, on ``workers`` when given (see the module docstring). :meth:`close` (or
    the context manager) releases the records it keeps; the workers stay with their owner."""

    def __init__(
        self,
        spec: SimSpec,
        requests: Sequence[WorkloadRequest],
        bundle: PolicyBundle,
        *,
        records: Sequence[ProfileRecord] = (),
        workers: PlanWorkers | None = None,
    ) -> None:
        bundle.validate()
        names = {s.name for s in spec.services}
        stray = sorted({r.service for r in requests} - names)
        if stray:
            raise ValueError(
                f"requests name services the spec does not have: {stray}; known: {sorted(names)}"
            )
        self.workers = workers
        self._args = (spec, list(requests), bundle, list(records))
        self._key = next(_KEYS)
        self._payload: bytes | None = None
        self._local: _Scorer | None = None
        self.simulated = 0

    def _scorer(self) -> _Scorer:
        if self._local is None:
            self._local = _Scorer(*self._args)
        return self._local

    def records(self, plan: Sequence[InstancePlan]) -> list[RequestRecord]:
        """Every request's record under ``plan`` in arrival order, as :meth:`evaluate` scores it (in
        this process; a request no instance hosts fails with "no instance")."""
        return self._scorer().records(plan)

    @property
    def parallelism(self) -> int:
        """Plans scored side by side (:class:`PlanEvaluator`): the worker processes."""
        return self.workers.processes if self.workers is not None else 1

    def evaluate(self, plans: Sequence[Sequence[InstancePlan]]) -> list[PlanScore]:
        self.simulated += len(plans)
        if self.workers is None or self.workers.processes == 1 or len(plans) == 1:
            return [self._scorer().score(p) for p in plans]
        if self._payload is None:
            self._payload = pickle.dumps(self._args)
        return self.workers.score(self._key, self._payload, plans)

    def close(self) -> None:
        self._local = self._payload = None

    def __enter__(self) -> SimPlanEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def evaluator_factory(
    bundle: PolicyBundle, *, records: Sequence[ProfileRecord] = (), workers: PlanWorkers | None = None
) -> Callable[[SimSpec, Sequence[WorkloadRequest], float], SimPlanEvaluator]:
    """``(spec, requests, now) -> SimPlanEvaluator`` simulating candidate plans with ``bundle``'s engine
    policy and dispatch, on ``workers`` (kept across the evaluators): what ``simulate(evaluator_factory=...)``
    and the placement loop take."""

    def make(spec: SimSpec, requests: Sequence[WorkloadRequest], now: float) -> SimPlanEvaluator:
        return SimPlanEvaluator(spec, requests, bundle, records=records, workers=workers)

    return make


@dataclass(frozen=True)
class ClusterPlanEvaluators:
    """The live leader's :class:`~llmfleet.policies.placement.evaluator.PlanEvaluatorFactory`: a
    :class:`SimPlanEvaluator` replaying the window's requests of the config's services (catalog models
    and SLOs as ``llmfleet sim --cluster-config`` reads them; arrivals from the window's first) with the
    engines' local policy (``fcfs`` unless they all run one) and the services' dispatch (``dispatch``
    unless they all name one), ``placement`` naming the planner whose candidates are scored."""

    placement: str = "seallm"
    dispatch: str = "round_robin"

    def __call__(
        self, config: ClusterConfig, gpus: GpuPool, window: Sequence[WindowRequest]
    ) -> SimPlanEvaluator | None:
        services, engine = from_cluster_config(config)
        catalog = {s.name: s.model for s in services}
        rows = [w for w in window if w.service in catalog]
        if not rows:
            return None
        t0 = rows[0].arrival_s
        requests = [
            WorkloadRequest(f"{w.service}-{i}", w.arrival_s - t0, w.prompt_tokens, w.output_tokens,
                            w.service, catalog[w.service])
            for i, w in enumerate(rows)
        ]  # fmt: skip
        engines = [*config.engines.values()]
        if config.emulated is not None:
            engines.append(config.emulated.engine)
        local = {e.policy for e in engines}
        dispatch = {s.dispatch.policy for s in config.services.values() if s.dispatch is not None}
        bundle = PolicyBundle(
            "live",
            placement=self.placement,
            dispatch=dispatch.pop() if len(dispatch) == 1 else self.dispatch,
            engine=local.pop() if len(local) == 1 else "fcfs",
        )
        spec = SimSpec(ClusterSpec(gpus.count, hardware(gpus.hardware)), services, engine)
        return SimPlanEvaluator(spec, requests, bundle)
