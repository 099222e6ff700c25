"""Build and run simulations from names: policy presets, service assignment, side-by-side comparison.

A *policy preset* bundles the four choices a serving system makes: placement (which instances host
which models), dispatch (which instance gets a request), the engine-local request policy (continuous
batching) or static batcher, and their options. Every name resolves through the policy registries in
``llmfleet.policies``, so a preset is exactly the code the live services run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from llmfleet.costmodel import ProfileRecord
from llmfleet.policies.batching import POLICIES as BATCHING
from llmfleet.policies.batching import make_batching_policy
from llmfleet.policies.dispatch import POLICIES as DISPATCH
from llmfleet.policies.dispatch import make_dispatch_policy
from llmfleet.policies.placement import GpuPool, InstancePlan, ServiceLoad, make_placement_policy
from llmfleet.policies.request import POLICIES as REQUEST
from llmfleet.policies.request import make_request_policy
from llmfleet.sim.cost import CostBook
from llmfleet.sim.metrics import summarize
from llmfleet.sim.partition import partition_blocker, run_partitioned
from llmfleet.sim.simulator import Predict, SimResult, Simulator
from llmfleet.sim.spec import SimSpec
from llmfleet.workload import Workload
from llmfleet.workload.synthesis import kmeans_labels, length_features


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

    @property
    def static(self) -> bool:
        return self.local in BATCHING

    def validate(self) -> None:
        if self.local not in REQUEST and self.local not in BATCHING:
            raise ValueError(
                f"unknown engine-local policy {self.local!r}; valid: {sorted({*REQUEST, *BATCHING})}"
            )
        if self.dispatch not in DISPATCH:
            raise ValueError(f"unknown dispatch policy {self.dispatch!r}; valid: {sorted(DISPATCH)}")

    def local_factory(self) -> Callable[[], object]:
        if self.static:
            return lambda: make_batching_policy(self.local, **self.local_options)
        return lambda: make_request_policy(self.local, **self.local_options)


PRESETS: dict[str, PolicyBundle] = {
    b.name: b
    for b in [
        PolicyBundle("vllm", "dedicated_even", "round_robin", "fcfs",
                     description="vLLM: GPUs split evenly per model, FCFS, round-robin"),
        PolicyBundle("alpaserve", "colocate_all", "round_robin", "fcfs",
                     description="AlpaServe-like: all models on every instance, FCFS, shared KV cache"),
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
    """Per-service demand for the placement planner (rates and mean lengths from the workload)."""
    dur = max(workload.duration_s, 1e-9)
    out = []
    for s in spec.services:
        rs = [r for r in workload.requests if r.service == s.name]
        out.append(
            ServiceLoad(
                s.name,
                s.model,
                len(rs) / dur,
                float(np.mean([r.prompt_tokens for r in rs])) if rs else 0.0,
                float(np.mean([r.output_tokens for r in rs])) if rs else 0.0,
            )
        )
    return out


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
) -> Experiment:
    """Place, dispatch and run ``workload`` under ``policy`` on ``spec.cluster``.

    ``workers`` > 1 splits the run across that many processes when the result stays exact (a
    load-blind dispatcher, see :mod:`llmfleet.sim.partition`); otherwise it runs in this process and
    ``result.workers`` is 1."""
    policy.validate()
    if not workload.requests:
        raise ValueError("the workload has no requests")
    workload = assign_services(workload, spec)
    if plan is None:
        planner = make_placement_policy(policy.placement, **policy.placement_options)
        gpus = GpuPool(spec.cluster.hw.name, spec.cluster.count, spec.cluster.hw.gpus_per_node)
        plan = planner.place(gpus, service_loads(workload, spec))
    cost = CostBook.build(spec.cluster.hw, spec.archs(), records)
    dispatch = make_dispatch_policy(policy.dispatch, **policy.dispatch_options)
    period = max(workload.duration_s, 1.0) / max(samples, 1)
    sim = Simulator(
        spec, list(plan), policy.local_factory(), dispatch, cost,
        fast_forward=fast_forward, sample_period_s=period, predict=predict,
    )  # fmt: skip
    if workers > 1 and partition_blocker(sim) is None:
        result = run_partitioned(sim, workload.requests, workers, progress=progress, strict_services=True)
    else:
        result = sim.run(
            workload.requests, total=len(workload.requests), progress=progress, strict_services=True
        )
    report = summarize(result, spec.services)
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
