"""The one SeaLLM setup (paper §6.1), shared by ``papers/seallm.py`` and ``placement_bench.py``.

Paper §6.1, quoted:

- "a cluster with 4 nodes and 32 GPUs. Each node has 8 NVIDIA A800 80GB GPUs" → 32 × catalog
  ``a100-80gb`` (the A800 is an A100 with less NVLink), 8 per node.
- "Llama2-7B&13B&70B [44] and OPT-6.7B [54]. The input lengths and output lengths of requests are
  sampled from … ShareGPT … LongBench … We use the K-means clustering algorithm to partition the
  requests according to their input and output lengths. For each request group, we randomly assign an
  LLM" → k-means (k = 4) over the union of the Azure conv trace's (input, output) lengths (no ShareGPT
  file here) and LongBench-like lengths synthesized from SeaLLM's Table 1 means (4,000 samples); the
  clusters, ordered by mean total length, go to OPT-6.7B, Llama2-7B, Llama2-13B, Llama2-70B (a fixed
  order, not random: OPT's 2,048-token context goes to the shortest requests). Prompts are truncated
  so prompt + output fits the context (OPT 2,048, Llama 2 4,096). Llama2-70B needs TP ≥ 2 on 80 GB.
  The headline uses ShareGPT-like lengths with SeaLLM's Table 1 means ("Chatbot ShareGPT 73.0 426.9",
  log-normal σ = 1, ``SHAREGPT_SEALLM``) in place of the conv trace; the conv trace stays as the
  ``conv`` variant. "For each request group, we randomly assign an LLM": ``assignment`` seeds a random
  permutation of the four models over the clusters (ordered by mean total length); ``assignment=None``
  is the fixed order above.
- "We round-robin functions in MAF to LLM services and generate traffic for each service" → per-service
  shares from ``llmfleet.workload.popularity``: MAF's function counts if a file is given, else a Zipf
  law matched to MAF's published heavy tail (18.6 % of functions → 99.6 % of invocations, n = 10,000,
  s ≈ 1.63), functions dealt round-robin in a seeded random order. Each service gets its own Gamma
  renewal process (CV ``ARRIVAL_CV`` = 4, bursty; an assumption fixed before any run, not fitted to MAF).
- "We share at most two LLM services per local engine because of the GPU memory limitation" → Algorithm
  1 with ``max_services=(2,)``; "β in Equation 8 to 0.1" → the ``seallm-placement`` preset (adaptive
  interval, β = 0.1, first interval 60 s).
- "vLLM … cannot share services and uses FCFS for scheduling. We allocate the GPUs evenly to LLM
  services" → ``vllm-v0.4``: ``dedicated_even``, FCFS with one phase per iteration, fewest-requests
  dispatch.
- "We change the average arrival rate of requests from 2 to 50 requests per second" → the sweep. Each
  rate is reported with its offered load relative to the cluster's capacity (``offered_load``).
- "we allocate the GPUs evenly" for vLLM, without saying how each model's share is deployed: as
  replicas behind a dispatcher (``vllm``: ``dedicated_even``, smallest fitting TP) and as one server per
  model at TP = its even share (``vllm_share_plan``: 32 GPUs / 4 models = TP 8).
- Ablation (§6.4): "SeaLLM-F" replaces DB scheduling with FCFS, "SeaLLM-A" keeps the first placement
  (no adaptive replacement) → ``seallm_fcfs`` (vLLM's FCFS engines on SeaLLM's plan and dispatch) and
  ``seallm_fixed``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
from llmfleet.costmodel.models import model_arch
from llmfleet.policies.placement import (
    GpuPool,
    InstancePlan,
    PlacementContext,
    SeaLLMOptions,
    SeaLLMPlacement,
)
from llmfleet.sim.cost import CostBook
from llmfleet.sim.memory import pool_layout
from llmfleet.sim.plan_eval import PlanWorkers, SimPlanEvaluator, evaluator_factory
from llmfleet.sim.run import PolicyBundle, assign_services, preset, service_loads
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.workload import (
    LengthStats,
    Popularity,
    Workload,
    WorkloadRequest,
    load_function_counts,
    lognormal_lengths,
    longbench_like_lengths,
    multi_service_workload,
    round_robin_shares,
    zipf_popularity,
)

CLUSTER = "32xA100-80GB"
MODELS = ("opt-6.7b", "llama2-7b", "llama2-13b", "llama2-70b")  # shortest → longest clusters
SERVICES = tuple(f"svc{i}" for i in range(len(MODELS)))
ARRIVAL_CV = 4.0
LONG_SAMPLES = 4000
SHORT_SAMPLES = 16000  # ShareGPT-like pairs in the k-means beside the LongBench-like ones
SHAREGPT_SEALLM = LengthStats(73.0, 426.9, "ShareGPT, SeaLLM Table 1: mean input 73.0, output 426.9")
LENGTHS = ("sharegpt", "conv")  # the headline lengths, then the conv-trace variant
ASSIGNMENTS = (0, 1, 2, 3)  # seeds of the random model ↔ length-cluster assignments
RATES = (2.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0)  # req/s, the paper's 2–50 range
HORIZON_S = 300.0  # ≥ 5 minutes per run
POPULARITY_SEED = 0


def assigned_models(assignment: int | None = None) -> tuple[str, ...]:
    """The model of each service (cluster, shortest first): ``MODELS`` in order, or a random
    permutation seeded by ``assignment``."""
    if assignment is None:
        return MODELS
    perm = np.random.default_rng(assignment).permutation(len(MODELS))
    return tuple(MODELS[int(i)] for i in perm)


def spec(assignment: int | None = None) -> SimSpec:
    models = assigned_models(assignment)
    return SimSpec(
        ClusterSpec.parse(CLUSTER), tuple(SimService(s, m) for s, m in zip(SERVICES, models, strict=True))
    )


def short_lengths(lengths: str, conv: Workload | None = None) -> Workload:
    """The short requests of the k-means: ShareGPT-like pairs (Table 1 means) or the conv trace."""
    if lengths == "conv":
        if conv is None:
            raise ValueError("the conv variant needs the conv trace")
        return conv
    if lengths != "sharegpt":
        raise ValueError(f"lengths must be one of {LENGTHS}, got {lengths!r}")
    a = lognormal_lengths(SHAREGPT_SEALLM, SHORT_SAMPLES, seed=11, max_prompt=4096, max_output=4096)
    return Workload(
        tuple(WorkloadRequest(f"g{i}", 0.0, int(p), int(o), "") for i, (p, o) in enumerate(a.tolist()))
    )


def vllm_share_plan(sp: SimSpec) -> list:
    """vLLM as one server per model at TP = its even share of the GPUs (a power of two ≤ a node)."""

    models = sorted(sp.models)
    tp = 1
    while tp * 2 <= min(sp.cluster.count // len(models), sp.cluster.hw.gpus_per_node):
        tp *= 2
    return [InstancePlan(f"{m}-tp{tp}", (m,), tp) for m in models]


def offered_load(sp: SimSpec, pools: dict[str, tuple[str, np.ndarray]], share: dict[str, float], rate: float,
                 cost_source: str = "roofline", samples: int = 400) -> float:  # fmt: skip
    """The GPUs the offered work keeps busy ÷ the cluster's GPUs, at each model's reference TP: per request
    TP × (prefill + its share of decode iterations at the largest batch the KV pool holds at the pool's
    mean length, capped by ``max_batch_requests``). Queueing, preemption and the batches a real run forms
    are left out, so 1.0 is an upper bound of the rate any system sustains."""

    hw, ref = sp.cluster.hw, sp.reference_tps()
    archs = sp.archs()
    book = CostBook.build(hw, archs, source=cost_source)
    busy = 0.0
    for s, (model, lens) in pools.items():
        tp, arch = ref[model], archs[model]
        sub = lens[:: max(1, len(lens) // samples)].astype(float)
        lm = book.model(model, tp)
        kv_tokens = pool_layout(hw, tp, [arch], sp.engine).kv_bytes / arch.kv_bytes_per_token
        b = max(1.0, min(sp.engine.limits.max_batch_requests, kv_tokens / float(sub.sum(axis=1).mean())))
        per = [lm.prefill(p) + o * lm.decode(b, b * (p + o / 2)) / b for p, o in sub.tolist()]
        busy += rate * share[s] * tp * float(np.mean(per))
    return busy / sp.cluster.count


def popularity(path: Path | None = None, seed: int = POPULARITY_SEED) -> Popularity:
    """MAF function counts from ``path``, else the Zipf stand-in (see the module docstring)."""
    return load_function_counts(path) if path is not None else zipf_popularity(seed=seed)


def shares(pop: Popularity) -> dict[str, float]:
    return round_robin_shares(pop, SERVICES)


def length_pools(short: Workload, sp: SimSpec | None = None) -> dict[str, tuple[str, np.ndarray]]:
    """Service → (model, (prompt, output) samples): k-means over ``short`` (``short_lengths``) ∪
    LongBench-like lengths."""
    sp = sp or spec()
    long = longbench_like_lengths(LONG_SAMPLES, seed=23)
    reqs = [
        WorkloadRequest(f"c{i}", 0.0, r.prompt_tokens, r.output_tokens, "")
        for i, r in enumerate(short.requests)
    ]
    reqs += [WorkloadRequest(f"l{i}", 0.0, int(p), int(o), "") for i, (p, o) in enumerate(long.tolist())]
    labelled = assign_services(Workload(tuple(reqs)), sp)
    model = {s.name: s.model for s in sp.services}
    out: dict[str, list[tuple[int, int]]] = {s.name: [] for s in sp.services}
    for r in labelled.requests:
        ctx = model_arch(model[r.service]).max_context
        o = min(r.output_tokens, ctx - 1)
        out[r.service].append((max(1, min(r.prompt_tokens, ctx - o)), o))
    for s, v in out.items():
        if not v:
            raise ValueError(f"k-means left service {s} without requests")
    return {s: (model[s], np.array(v, dtype=np.int64)) for s, v in out.items()}


def workload(
    pools: dict[str, tuple[str, np.ndarray]],
    share: dict[str, float],
    rate: float,
    duration_s: float,
    seed: int,
) -> Workload:
    """Each service its own Gamma(CV) process at ``rate`` × its share, over [0, duration_s)."""
    rates = {s: rate * share[s] for s in pools if rate * share[s] > 0}
    if not rates:
        raise ValueError(f"rate {rate} req/s gives no service any traffic")
    sub = {s: pools[s] for s in rates}
    return multi_service_workload(sub, rates, duration_s=duration_s, cv=ARRIVAL_CV, seed=seed)


def vllm() -> PolicyBundle:
    return dataclasses.replace(preset("vllm-v0.4"), name="vllm")


HISTORY_S = 60.0  # the arrivals Algorithm 1 is searched on, for the fixed-plan variant


def place(sp: SimSpec, history: Workload, workers: PlanWorkers | None = None) -> tuple[list, str]:
    """Algorithm 1 (≤ 2 services per engine) searched once on ``history`` with the preset's own engines
    and dispatch (on ``workers``, else in this process): the plan and the planner's reason (SeaLLM
    without re-placement: the paper's SeaLLM-A)."""

    b = preset("seallm-placement")
    planner = SeaLLMPlacement(SeaLLMOptions(max_services=(2,)))
    gpus = GpuPool(sp.cluster.hw.name, sp.cluster.count, sp.cluster.hw.gpus_per_node)
    with SimPlanEvaluator(sp, history.requests, b, workers=workers) as ev:
        plan = planner.place(gpus, service_loads(history, sp), PlacementContext(evaluator=ev))
    return plan, planner.last_reason


def seallm_fixed(admission: str | None = None) -> PolicyBundle:
    """The engines and dispatch of ``seallm-placement`` on a given plan (no re-placement: SeaLLM-A);
    ``admission`` sets the doubling budget's admission option (None: its default)."""
    b = dataclasses.replace(preset("seallm"), name="seallm-fixed", placement="seallm")
    if admission is None:
        return b
    return dataclasses.replace(
        b.with_overrides(engine={"options": {"admission": admission}}), name=f"seallm-{admission}"
    )


def seallm_fcfs() -> PolicyBundle:
    """SeaLLM-F: SeaLLM's plan and dispatch with vLLM's FCFS engines (one phase per iteration)."""
    return dataclasses.replace(seallm_fixed().with_overrides(engine=vllm().engine), name="seallm-fcfs")


def seallm(workers: PlanWorkers | None = None) -> tuple[PolicyBundle, Callable]:
    """The ``seallm-placement`` preset (Algorithm 1 ≤ 2 services per engine, Eq. 8) and the factory of
    the simulator that scores its candidate plans (with the preset's own engines and dispatch, on
    ``workers``, else in this process)."""
    b = preset("seallm-placement", placement={"options": {"max_services": (2,)}})
    return b, evaluator_factory(b, workers=workers)
