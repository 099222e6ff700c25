"""Build and run simulations from names: policy presets, service assignment, side-by-side comparison.

A *policy preset* is a :class:`~llmfleet.sim.bundle.PolicyBundle`: the spec sections a cluster file
holds (:mod:`llmfleet.spec`: engine, dispatch, placement, migration, capacity), named. Every name
resolves through the policy registries in ``llmfleet.policies``, so a preset is exactly the code the
live services run, and ``llmfleet sim --cluster-config`` runs a live cluster file's own sections.

With ``placement.interval_s`` the placement planner also runs during the simulation, every interval
over the recent workload (:class:`~llmfleet.sim.replan.PlacementLoop`), and its plans are applied as
the live placement leader applies them: loads, moves and drains take simulated time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from llmfleet.costmodel import ProfileRecord
from llmfleet.policies.batching import StaticBatchPolicy
from llmfleet.policies.dispatch import DispatchPolicy, Rebalancer, make_dispatch_policy
from llmfleet.policies.dispatch.mell import MellDispatch
from llmfleet.policies.migration import MellPacker, make_migration_policy, make_transfer_planner
from llmfleet.policies.placement import (
    AdaptiveInterval,
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementPlanner,
    ServiceLoad,
    make_placement_policy,
)
from llmfleet.policies.request import RequestPolicy
from llmfleet.sim.bundle import FIRST_PLANS, PolicyBundle
from llmfleet.sim.cost import CostBook
from llmfleet.sim.metrics import summarize
from llmfleet.sim.migration import MigrationLoop, QueueMoveLoop, RebalanceLoop
from llmfleet.sim.partition import partition_blocker, run_partitioned
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.replan import EvaluatorFactory, PlacementLoop
from llmfleet.sim.scls_central import make_central
from llmfleet.sim.simulator import Predict, SimResult, Simulator
from llmfleet.sim.spec import SimService, SimSpec
from llmfleet.workload import Workload
from llmfleet.workload.conversations import deal_sessions
from llmfleet.workload.synthesis import kmeans_labels, length_features

_RECOMPUTE = {"slice_end": "recompute"}  # the papers' static batching: padded rows, recompute at slice ends
_ONE_PHASE = {"policy": "fcfs", "options": {"single_phase": True}}

PRESETS: dict[str, PolicyBundle] = {
    b.name: b
    for b in [
        PolicyBundle("vllm", "dedicated_even", "round_robin", "fcfs",
                     description="vLLM: GPUs split evenly per model, FCFS, round-robin"),
        PolicyBundle("vllm-v0.4", "dedicated_even", "jsq", _ONE_PHASE,
                     description="vLLM 0.2-0.4 as the papers compared it: GPUs split evenly per model, FCFS with "
                                 "one phase per iteration (prefill first), fewest-requests dispatch"),
        PolicyBundle("alpaserve", "colocate_all", "round_robin", "fcfs",
                     description="AlpaServe-like: all models on every instance, FCFS, shared KV cache"),
        PolicyBundle("alpaserve-v0.4", "colocate_all", "jsq", _ONE_PHASE,
                     description="AlpaServe in SeaLLM's vLLM-based engine: all models on every instance, shared KV, "
                                 "FCFS one phase per iteration, fewest-requests dispatch"),
        PolicyBundle("muxserve", "colocate_all", "round_robin", "muxserve_rr",
                     description="MuxServe-like: colocated models, round-robin prefill across services"),
        PolicyBundle("seallm", "colocate_all", "jsq", "doubling_budget",
                     description="SeaLLM: colocated models, doubling-budget scheduling, fewest-requests dispatch"),
        PolicyBundle("fcfs-rr", "dedicated_even", "round_robin", "fcfs", description="FCFS, round-robin"),
        PolicyBundle("fcfs-jsq", "dedicated_even", "jsq", "fcfs", description="FCFS, join shortest queue"),
        PolicyBundle("fcfs-p2c", "dedicated_even", "power_of_two", "fcfs", description="FCFS, power of two"),
        PolicyBundle("fcfs-least-loaded", "dedicated_even", "least_loaded", "fcfs",
                     description="FCFS, lowest KV utilisation"),
        PolicyBundle("fcfs-best-fit", "dedicated_even", "best_fit_kv", "fcfs", description="FCFS, best fit by free KV"),
        PolicyBundle("fcfs-worst-fit", "dedicated_even", "worst_fit_kv", "fcfs",
                     description="FCFS, worst fit by free KV"),
        PolicyBundle("sls", "dedicated_even", "round_robin",
                     {"policy": "static_sls", "options": {"batch_size": 16, **_RECOMPUTE}},
                     description="static SLS: static batches of 16, FCFS, round-robin"),
        PolicyBundle("seallm-placement", {"policy": "seallm", "interval_s": 60.0, "adaptive_interval": True},
                     "jsq", "doubling_budget",
                     description="SeaLLM: Algorithm 1 placement re-run from 60 s (adaptive, Eq. 8), doubling budget, "
                                 "fewest-requests dispatch"),
        PolicyBundle("aladdin-scaling", {"policy": "aladdin", "interval_s": 60.0}, "jsq", "fcfs",
                     description="Aladdin: N_g* worker size and linear worker count re-planned every 60 s, FCFS, JSQ "
                                 "(best-fit dispatch needs latency models: set dispatch options)"),
    ]
}  # fmt: skip


def preset(name: str, **overrides: Any) -> PolicyBundle:
    """A preset by name. ``overrides`` per section: a policy name or a section replaces it, a mapping
    updates its fields (``placement={"interval_s": 60}``); None leaves it (see
    :meth:`PolicyBundle.with_overrides`)."""
    try:
        b = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; valid: {sorted(PRESETS)}") from None
    return b.with_overrides(**overrides)


class ServiceList(Protocol):
    """What :func:`assign_services` reads of a spec: its services, in order."""

    @property
    def services(self) -> Sequence[SimService]: ...


def assign_services(workload: Workload, spec: ServiceList, seed: int = 0) -> Workload:
    """Label requests with the spec's services.

    Labels that already name spec services are kept. Otherwise, a workload of conversations (requests
    naming a ``session``) is dealt to the services conversation by conversation, round-robin in order of
    first arrival (:func:`~llmfleet.workload.conversations.deal_sessions`); with one service everything goes to it;
    with k services the requests are clustered by (prompt, output) length with k-means (SeaLLM §7: the
    services are length clusters) and cluster i, ordered by mean total length, becomes the i-th service
    of the spec — so list services from shortest to longest requests.
    """
    names = [s.name for s in spec.services]
    reqs = workload.requests
    if all(r.service in names for r in reqs):
        return workload
    if any(r.session for r in reqs):  # conversations stay whole, each with one service
        return deal_sessions(workload, [(s.name, s.model) for s in spec.services])
    if len(names) == 1:
        return Workload(
            tuple(dataclasses.replace(r, service=names[0], model=spec.services[0].model) for r in reqs)
        )
    lengths = np.array([[r.prompt_tokens, r.output_tokens] for r in reqs], dtype=float)
    labels = kmeans_labels(length_features(lengths), len(names), seed=seed)
    order = np.argsort([lengths[labels == c].sum(axis=1).mean() for c in range(len(names))], kind="stable")
    rank = {int(c): i for i, c in enumerate(order)}
    out = []
    for r, c in zip(reqs, labels, strict=True):
        svc = spec.services[rank[int(c)]]
        out.append(dataclasses.replace(r, service=svc.name, model=svc.model))
    return Workload(tuple(out))


def service_loads(workload: Workload, spec: SimSpec) -> list[ServiceLoad]:
    """Per-service demand for the placement planner (rates, lengths' mean and spread from the
    workload, the service's SLO)."""
    dur = max(workload.duration_s, 1e-9)
    out = []
    for s in spec.services:
        rs = [r for r in workload.requests if r.service == s.name]
        prompt = np.array([r.prompt_tokens for r in rs], dtype=float)
        output = np.array([r.output_tokens for r in rs], dtype=float)
        out.append(
            ServiceLoad(
                s.name, s.model, len(rs) / dur,
                float(prompt.mean()) if rs else 0.0, float(output.mean()) if rs else 0.0,
                float(prompt.std()) if rs else 0.0, float(output.std()) if rs else 0.0, s.slo,
                adapter=s.adapter,
            )
        )  # fmt: skip
    return out


def cold_loads(spec: SimSpec) -> list[ServiceLoad]:
    """What a live leader's first plan sees: every service, no request yet."""
    return [ServiceLoad(s.name, s.model, slo=s.slo, adapter=s.adapter) for s in spec.services]


@dataclass
class Experiment:
    """One policy on one workload: the plan, the raw result and the summary report."""

    policy: PolicyBundle
    plan: list[InstancePlan]
    result: SimResult
    report: dict


def simulate(
    spec: SimSpec,
    workload: Workload,
    policy: PolicyBundle,
    *,
    records: Sequence[ProfileRecord] = (),
    plan: Sequence[InstancePlan] | None = None,
    predict: Predict | None = None,
    fast_forward: bool = True,
    samples: int = 400,
    progress: Callable[[int, float], None] | None = None,
    workers: int = 1,
    evaluator_factory: EvaluatorFactory | None = None,
    stop: Callable[[RequestRecord], bool] | None = None,
) -> Experiment:
    """Place, dispatch and run ``workload`` under ``policy`` on ``spec.cluster``.

    The first plan (unless ``plan`` is given) comes from the whole workload's demand; a planner that
    scores plans by simulation gets ``evaluator_factory(spec, requests, now)`` over the first
    ``placement.window_s`` (else interval, else the whole workload). With ``policy.placement.interval_s``
    a :class:`PlacementLoop` re-plans during the run; its decisions are ``report["placement"]``.

    ``workers`` > 1 splits the run across that many processes when the result stays exact (a
    load-blind dispatcher, a fixed plan and no closed-loop turns, see :mod:`llmfleet.sim.partition`);
    otherwise it runs in this process and ``result.workers`` is 1.

    ``stop``: end the run at the first completed request it answers True for (``Simulator.run``); the
    report is over the records so far and says when (``stopped_s``). Such a run is not split."""
    policy.validate()
    if not workload.requests:
        raise ValueError("the workload has no requests")
    workload = assign_services(workload, spec)
    gpus = GpuPool(
        spec.cluster.hw.name, spec.cluster.count, spec.cluster.max_tp,
        spec.engine.max_loras, spec.engine.max_lora_rank, spec.engine.limits, spec.engine.mem_fraction,
        spec.engine.kv_bytes,
    )  # fmt: skip
    planner = _planner(policy, plan, evaluator_factory)
    if plan is None:
        assert planner is not None
        plan = _first_plan(spec, workload, policy, planner, gpus, evaluator_factory)
    cost = CostBook.build(spec.cluster.hw, spec.archs(), records, spec.cost_source)
    central = make_central(policy.dispatch.policy, policy.dispatch.options) if policy.central else None
    dispatch: DispatchPolicy
    make_local: Callable[[], RequestPolicy | StaticBatchPolicy]
    if central is not None:
        dispatch, make_local = central.maxmin, central.make_feed
    else:
        dispatch = make_dispatch_policy(policy.dispatch.policy, **policy.dispatch.options)
        make_local = policy.local_factory()
    period = max(workload.duration_s, 1.0) / max(samples, 1)
    sim = Simulator(
        spec, list(plan), make_local, dispatch, cost,
        fast_forward=fast_forward, sample_period_s=period, predict=predict,
        preemption=policy.capacity.preemption_rule(),
    )  # fmt: skip
    loops = _Loops(central=central)
    loops.install(sim, policy, planner, gpus, evaluator_factory, workload.requests[0].arrival_s)
    if workers > 1 and stop is None and not workload.closed_loop and partition_blocker(sim) is None:
        result = run_partitioned(sim, workload.requests, workers, progress=progress, strict_services=True)
    else:
        result = sim.run(
            workload.requests, total=len(workload.requests), progress=progress, strict_services=True,
            stop=stop,
        )  # fmt: skip
    if loops.placement is not None:
        result.placement = [d.to_dict() for d in loops.placement.decisions]
    report = summarize(result, spec.services)
    report.update(loops.stats())
    report["policy"] = policy.to_dict()
    report["cost_source"] = spec.cost_source
    report["normalized_reference"] = spec.normalized_reference()
    report["plan"] = [dataclasses.asdict(p) for p in plan]
    report["cluster"]["spec"] = str(spec.cluster)
    return Experiment(policy, list(plan), result, report)


def _planner(
    policy: PolicyBundle, plan: Sequence[InstancePlan] | None, evaluator_factory: EvaluatorFactory | None
) -> PlacementPlanner | None:
    """The placement planner, when it plans (no plan given) or re-plans (a loop runs)."""
    if plan is not None and policy.placement.interval_s is None:
        return None
    planner = make_placement_policy(policy.placement.policy, **policy.placement.options)
    searches = policy.placement.interval_s is not None or (plan is None and policy.first_plan == "oracle")
    if planner.needs.evaluator and evaluator_factory is None and searches:
        raise ValueError(
            f"placement {policy.placement.policy!r} scores plans by simulating them: pass an evaluator_factory "
            "(e.g. one building llmfleet.sim.plan_eval.SimPlanEvaluator)"
        )
    return planner


def _first_plan(
    spec: SimSpec,
    workload: Workload,
    policy: PolicyBundle,
    planner: PlacementPlanner,
    gpus: GpuPool,
    evaluator_factory: EvaluatorFactory | None,
) -> list[InstancePlan]:
    """``first_plan`` "cold": from no demand, as a live leader starts; "oracle": from the workload's own
    demand, a planner that simulates scoring over its first window."""
    start = workload.requests[0].arrival_s
    if policy.first_plan == "cold":
        return planner.place(gpus, cold_loads(spec), PlacementContext(now=start))
    context = None
    if planner.needs.evaluator:
        assert evaluator_factory is not None
        window = policy.placement.window_s or policy.placement.interval_s or math.inf
        first = [r for r in workload.requests if r.arrival_s < start + window]
        context = PlacementContext(evaluator=evaluator_factory(spec, first, start), now=start)
    try:
        return planner.place(gpus, service_loads(workload, spec), context)
    finally:
        if context is not None and context.evaluator is not None:
            context.evaluator.close()


@dataclass
class _Loops:
    """The loops a bundle runs beside the simulation, each installed when its section asks for it."""

    central: Any = None  # the SCLS central driver (sim.scls_central), when dispatch is central
    placement: PlacementLoop | None = None
    migration: MigrationLoop | None = None
    queue_moves: QueueMoveLoop | None = None
    rebalance: RebalanceLoop | None = None

    def install(
        self,
        sim: Simulator,
        policy: PolicyBundle,
        planner: PlacementPlanner | None,
        gpus: GpuPool,
        evaluator_factory: EvaluatorFactory | None,
        start: float,
    ) -> None:
        if self.central is not None:
            self.central.install(sim)
        sim.fleet.set_binding(policy.capacity.binding, policy.capacity.saturation())
        sim.fleet.cold_start = policy.capacity.cold_start
        sim.fleet.fairness = policy.capacity.fairness
        p, mig = policy.placement, policy.migration
        if p.interval_s is not None:
            assert planner is not None
            adaptive = (
                AdaptiveInterval(
                    initial_s=p.interval_s, min_s=min(1.0, p.interval_s), max_s=max(3600.0, p.interval_s)
                )
                if p.adaptive_interval
                else None
            )
            self.placement = PlacementLoop(planner, gpus, p.interval_s, p.window_s, evaluator_factory, adaptive,
                                           confirm_intervals=p.confirm_intervals)  # fmt: skip
            self.placement.install(sim, start)
        if mig.runs:
            self.migration = MigrationLoop(
                make_migration_policy(mig.policy, **mig.options), make_transfer_planner(mig.transfer), mig.epoch_s,
                policy_name=mig.policy, transfer_name=mig.transfer,
            )  # fmt: skip
            if isinstance(sim.dispatch, MellDispatch) and isinstance(self.migration.policy, MellPacker):
                sim.dispatch.view_source = (
                    self.migration.policy.view
                )  # arrivals go where Allocate would put them
            self.migration.install(sim)
        if policy.capacity.move_queued:  # the alternative to late binding, any dispatch policy
            self.queue_moves = QueueMoveLoop(policy.capacity.saturation(), mig.epoch_s)
            self.queue_moves.install(sim)
        if isinstance(sim.dispatch, Rebalancer):  # Aladdin Algorithm 2, each epoch
            self.rebalance = RebalanceLoop(sim.dispatch, mig.epoch_s)
            self.rebalance.install(sim)

    def stats(self) -> dict[str, Any]:
        """The report's entries of the loops that ran."""
        loops = {"migration": self.migration, "rebalance": self.rebalance, "queue_moves": self.queue_moves,
                 "scls_central": self.central}  # fmt: skip
        return {name: loop.stats.to_dict() for name, loop in loops.items() if loop is not None}


__all__ = [
    "FIRST_PLANS",
    "PRESETS",
    "Experiment",
    "PolicyBundle",
    "ServiceList",
    "assign_services",
    "preset",
    "service_loads",
    "simulate",
]
