"""Build and run simulations from names: policy presets, service assignment, side-by-side comparison.

A *policy preset* bundles the four choices a serving system makes: placement (which instances host
which models), dispatch (which instance gets a request), the engine-local request policy (continuous
batching) or static batcher, and their options. Every name resolves through the policy registries in
``llmfleet.policies``, so a preset is exactly the code the live services run.

With ``placement_interval_s`` the placement planner also runs during the simulation, every interval
over the recent workload (:class:`~llmfleet.sim.replan.PlacementLoop`), and its plans are applied as
the live placement leader applies them: loads, moves and drains take simulated time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from llmfleet.costmodel import ProfileRecord
from llmfleet.policies.batching import POLICIES as BATCHING
from llmfleet.policies.batching import make_batching_policy
from llmfleet.policies.capacity import BINDINGS, Saturation
from llmfleet.policies.dispatch import POLICIES as DISPATCH
from llmfleet.policies.dispatch import Rebalancer, make_dispatch_policy
from llmfleet.policies.dispatch.mell import MellDispatch
from llmfleet.policies.migration import POLICIES as MIGRATION
from llmfleet.policies.migration import TRANSFERS, MellPacker, make_migration_policy, make_transfer_planner
from llmfleet.policies.placement import POLICIES as PLACEMENT
from llmfleet.policies.placement import (
    AdaptiveInterval,
    GpuPool,
    InstancePlan,
    PlacementContext,
    ServiceLoad,
    make_placement_policy,
)
from llmfleet.policies.registry import lookup
from llmfleet.policies.request import POLICIES as REQUEST
from llmfleet.policies.request import make_request_policy
from llmfleet.sim.cost import CostBook
from llmfleet.sim.metrics import summarize
from llmfleet.sim.migration import MigrationLoop, QueueMoveLoop, RebalanceLoop
from llmfleet.sim.partition import partition_blocker, run_partitioned
from llmfleet.sim.replan import EvaluatorFactory, PlacementLoop
from llmfleet.sim.scls_central import CENTRAL_MODES, make_central
from llmfleet.sim.simulator import Predict, SimResult, Simulator
from llmfleet.sim.spec import SimSpec
from llmfleet.workload import Workload
from llmfleet.workload.synthesis import kmeans_labels, length_features

FIRST_PLANS = ("oracle", "cold")


@dataclass(frozen=True)
class PolicyBundle:
    """``local`` names a request policy (continuous batching) or a static batcher."""

    name: str
    placement: str = "dedicated_even"
    dispatch: str = "round_robin"
    local: str = "fcfs"
    placement_options: dict[str, Any] = field(default_factory=dict)
    dispatch_options: dict[str, Any] = field(default_factory=dict)
    local_options: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    placement_interval_s: float | None = None  # re-plan every interval during the run (None: plan once)
    placement_window_s: float | None = None  # the recent workload a plan is made from (default: interval)
    adaptive_interval: bool = False  # SeaLLM Eq. 8: the interval adapts, from placement_interval_s
    placement_confirm_intervals: int = 1  # hysteresis: apply a changed plan once proposed this often in a row
    migration: str | None = None  # a llmfleet.policies.migration policy run every epoch (None: no loop)
    migration_options: dict[str, Any] = field(default_factory=dict)
    transfer: str = "hybrid"  # how moves travel: hybrid (Mell), kv, tokens
    migration_epoch_s: float = 1.0
    # requests wait for capacity (issue 26; llmfleet.sim.fleet): late = hold arrivals while every
    # instance of their model is saturated (binding_options: queue_slack, kv_fraction); cold_start =
    # a request for a model no instance serves waits for the placement loop (when one runs)
    binding: str = "early"
    binding_options: dict[str, Any] = field(default_factory=dict)
    cold_start: bool = True
    move_queued: bool = False  # every migration_epoch_s, move queued requests off full instances
    # the plan in force at the start: "oracle" = planned on the workload's own demand (its first window
    # for planners that simulate); "cold" = as a live leader starts, with no requests seen yet (zero
    # rates, no evaluator), so the fleet's first plan is the same on both sides
    first_plan: str = "oracle"

    @property
    def central(self) -> bool:
        """``dispatch`` names a simulator central-scheduling mode (``scls_central``): a central pool batched
        and offloaded every interval (:mod:`llmfleet.sim.scls_central`, options in ``dispatch_options``);
        the instances run its batches with the static engine core and ``local`` is not used."""
        return self.dispatch in CENTRAL_MODES

    @property
    def static(self) -> bool:
        return self.local in BATCHING or self.central

    def validate(self) -> None:
        if self.local not in REQUEST and self.local not in BATCHING:
            raise ValueError(
                f"unknown engine-local policy {self.local!r}; valid: {sorted({*REQUEST, *BATCHING})}"
            )
        if self.dispatch not in DISPATCH and not self.central:
            raise ValueError(
                f"unknown dispatch policy {self.dispatch!r}; valid: {sorted([*DISPATCH, *CENTRAL_MODES])}"
            )
        if self.central and (self.placement_interval_s is not None or self.migration is not None):
            raise ValueError(
                f"dispatch {self.dispatch!r} runs on a fixed plan (no placement loop, no migration)"
            )
        if self.placement not in PLACEMENT:
            raise ValueError(f"unknown placement policy {self.placement!r}; valid: {sorted(PLACEMENT)}")
        for name in ("placement_interval_s", "placement_window_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"{name} must be > 0 s, got {v}")
        if self.placement_confirm_intervals < 1:
            raise ValueError(
                f"placement_confirm_intervals must be >= 1, got {self.placement_confirm_intervals}"
            )
        if self.adaptive_interval and self.placement_interval_s is None:
            raise ValueError("adaptive_interval needs placement_interval_s (its initial interval)")
        if self.first_plan not in FIRST_PLANS:
            raise ValueError(f"unknown first_plan {self.first_plan!r}; valid: {list(FIRST_PLANS)}")
        if self.binding not in BINDINGS:
            raise ValueError(f"unknown binding {self.binding!r}; valid: {list(BINDINGS)}")
        Saturation(**self.binding_options)  # TypeError/ValueError naming a bad option
        if self.binding == "late" and self.central:
            raise ValueError(f"binding late holds requests for dispatch; {self.dispatch!r} batches centrally")
        if self.migration is not None:
            lookup("migration", MIGRATION, self.migration)
            lookup("transfer", TRANSFERS, self.transfer)
            if not self.migration_epoch_s > 0:
                raise ValueError(f"migration_epoch_s must be > 0 s, got {self.migration_epoch_s}")

    def local_factory(self) -> Callable[[], object]:
        if self.static:
            return lambda: make_batching_policy(self.local, **self.local_options)
        return lambda: make_request_policy(self.local, **self.local_options)


PRESETS: dict[str, PolicyBundle] = {
    b.name: b
    for b in [
        PolicyBundle("vllm", "dedicated_even", "round_robin", "fcfs",
                     description="vLLM: GPUs split evenly per model, FCFS, round-robin"),
        PolicyBundle("vllm-v0.4", "dedicated_even", "jsq", "fcfs", local_options={"single_phase": True},
                     description="vLLM 0.2-0.4 as the papers compared it: GPUs split evenly per model, FCFS with "
                                 "one phase per iteration (prefill first), fewest-requests dispatch"),
        PolicyBundle("alpaserve", "colocate_all", "round_robin", "fcfs",
                     description="AlpaServe-like: all models on every instance, FCFS, shared KV cache"),
        PolicyBundle("alpaserve-v0.4", "colocate_all", "jsq", "fcfs", local_options={"single_phase": True},
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
        PolicyBundle("sls", "dedicated_even", "round_robin", "static_sls", local_options={"batch_size": 16},
                     description="static SLS: static batches of 16, FCFS, round-robin"),
        PolicyBundle("seallm-placement", "seallm", "jsq", "doubling_budget", placement_interval_s=60.0,
                     adaptive_interval=True,
                     description="SeaLLM: Algorithm 1 placement re-run from 60 s (adaptive, Eq. 8), doubling budget, "
                                 "fewest-requests dispatch"),
        PolicyBundle("aladdin-scaling", "aladdin", "jsq", "fcfs", placement_interval_s=60.0,
                     description="Aladdin: N_g* worker size and linear worker count re-planned every 60 s, FCFS, JSQ "
                                 "(best-fit dispatch needs latency models: set dispatch options)"),
    ]
}  # fmt: skip


def preset(name: str, **overrides: Any) -> PolicyBundle:
    """A preset by name; ``overrides`` replace fields (e.g. ``dispatch="jsq"``)."""
    try:
        b = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; valid: {sorted(PRESETS)}") from None
    b = dataclasses.replace(b, **{k: v for k, v in overrides.items() if v is not None})
    b.validate()
    return b


def assign_services(workload: Workload, spec: SimSpec, seed: int = 0) -> Workload:
    """Label requests with the spec's services.

    Labels that already name spec services are kept. Otherwise, with one service everything goes to it;
    with k services the requests are clustered by (prompt, output) length with k-means (SeaLLM §7: the
    services are length clusters) and cluster i, ordered by mean total length, becomes the i-th service
    of the spec — so list services from shortest to longest requests.
    """
    names = [s.name for s in spec.services]
    reqs = workload.requests
    if all(r.service in names for r in reqs):
        return workload
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
            )
        )  # fmt: skip
    return out


def cold_loads(spec: SimSpec) -> list[ServiceLoad]:
    """What a live leader's first plan sees: every service, no request yet."""
    return [ServiceLoad(s.name, s.model, slo=s.slo) for s in spec.services]


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
) -> Experiment:
    """Place, dispatch and run ``workload`` under ``policy`` on ``spec.cluster``.

    The first plan (unless ``plan`` is given) comes from the whole workload's demand; a planner that
    scores plans by simulation gets ``evaluator_factory(spec, requests, now)`` over the first
    ``placement_window_s`` (else interval, else the whole workload). With ``policy.placement_interval_s``
    a :class:`PlacementLoop` re-plans during the run; its decisions are ``report["placement"]``.

    ``workers`` > 1 splits the run across that many processes when the result stays exact (a
    load-blind dispatcher and a fixed plan, see :mod:`llmfleet.sim.partition`); otherwise it runs in
    this process and ``result.workers`` is 1."""
    policy.validate()
    if not workload.requests:
        raise ValueError("the workload has no requests")
    workload = assign_services(workload, spec)
    gpus = GpuPool(spec.cluster.hw.name, spec.cluster.count, spec.cluster.max_tp)
    planner = None
    if plan is None or policy.placement_interval_s is not None:
        planner = make_placement_policy(policy.placement, **policy.placement_options)
        searches = policy.placement_interval_s is not None or (plan is None and policy.first_plan == "oracle")
        if planner.needs.evaluator and evaluator_factory is None and searches:
            raise ValueError(
                f"placement {policy.placement!r} scores plans by simulating them: pass an evaluator_factory "
                "(e.g. one building llmfleet.sim.plan_eval.SimPlanEvaluator)"
            )
    if plan is None and policy.first_plan == "cold":
        assert planner is not None
        plan = planner.place(gpus, cold_loads(spec), PlacementContext(now=workload.requests[0].arrival_s))
    if plan is None:
        assert planner is not None
        context = None
        start = workload.requests[0].arrival_s
        if planner.needs.evaluator:
            assert evaluator_factory is not None
            window = policy.placement_window_s or policy.placement_interval_s or math.inf
            first = [r for r in workload.requests if r.arrival_s < start + window]
            context = PlacementContext(evaluator=evaluator_factory(spec, first, start), now=start)
        try:
            plan = planner.place(gpus, service_loads(workload, spec), context)
        finally:
            if context is not None and context.evaluator is not None:
                context.evaluator.close()
    cost = CostBook.build(spec.cluster.hw, spec.archs(), records, spec.cost_source)
    central = make_central(policy.dispatch, policy.dispatch_options) if policy.central else None
    if central is not None:
        dispatch, make_local = central.maxmin, central.make_feed
    else:
        dispatch = make_dispatch_policy(policy.dispatch, **policy.dispatch_options)
        make_local = policy.local_factory()
    period = max(workload.duration_s, 1.0) / max(samples, 1)
    sim = Simulator(
        spec, list(plan), make_local, dispatch, cost,
        fast_forward=fast_forward, sample_period_s=period, predict=predict,
    )  # fmt: skip
    if central is not None:
        central.install(sim)
    sim.set_binding(policy.binding, Saturation(**policy.binding_options))
    sim.cold_start = policy.cold_start
    loop = None
    if policy.placement_interval_s is not None:
        assert planner is not None
        interval = policy.placement_interval_s
        adaptive = (
            AdaptiveInterval(initial_s=interval, min_s=min(1.0, interval), max_s=max(3600.0, interval))
            if policy.adaptive_interval
            else None
        )
        loop = PlacementLoop(
            planner, gpus, interval, policy.placement_window_s, evaluator_factory, adaptive,
            confirm_intervals=policy.placement_confirm_intervals,
        )  # fmt: skip
        loop.install(sim, workload.requests[0].arrival_s)
    migration = None
    if policy.migration is not None:
        migration = MigrationLoop(
            make_migration_policy(policy.migration, **policy.migration_options),
            make_transfer_planner(policy.transfer),
            policy.migration_epoch_s,
            policy_name=policy.migration,
            transfer_name=policy.transfer,
        )
        if isinstance(dispatch, MellDispatch) and isinstance(migration.policy, MellPacker):
            dispatch.view_source = migration.policy.view  # arrivals go where Allocate would put them
        migration.install(sim)
    queue_moves = None
    if policy.move_queued:  # issue 26's alternative to late binding, any dispatch policy
        queue_moves = QueueMoveLoop(Saturation(**policy.binding_options), policy.migration_epoch_s)
        queue_moves.install(sim)
    rebalance = None
    if isinstance(dispatch, Rebalancer):  # Aladdin Algorithm 2, each epoch
        rebalance = RebalanceLoop(dispatch, policy.migration_epoch_s)
        rebalance.install(sim)
    if workers > 1 and partition_blocker(sim) is None:
        result = run_partitioned(sim, workload.requests, workers, progress=progress, strict_services=True)
    else:
        result = sim.run(
            workload.requests, total=len(workload.requests), progress=progress, strict_services=True
        )
    if loop is not None:
        result.placement = [d.to_dict() for d in loop.decisions]
    report = summarize(result, spec.services)
    if migration is not None:
        report["migration"] = migration.stats.to_dict()
    if rebalance is not None:
        report["rebalance"] = rebalance.stats.to_dict()
    if queue_moves is not None:
        report["queue_moves"] = queue_moves.stats.to_dict()
    if central is not None:
        report["scls_central"] = central.stats.to_dict()
    report["policy"] = dataclasses.asdict(policy)
    report["plan"] = [dataclasses.asdict(p) for p in plan]
    report["cluster"]["spec"] = str(spec.cluster)
    return Experiment(policy, list(plan), result, report)


__all__ = [
    "PRESETS",
    "Experiment",
    "PolicyBundle",
    "assign_services",
    "preset",
    "service_loads",
    "simulate",
]
