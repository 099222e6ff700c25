"""Aladdin's worker configuration (§4.1, Eq. 6) and a planner that splits a GPU pool into such workers.

Per-GPU decode throughput of a worker of N GPUs (tensor parallel, within a node):

    M(N)     = N·m_gpu·f − m_model − m_act                          (KV capacity, bytes)
    T_max(N) = min{ M / (N·m_r·(t_compute + t_comm)),  B / (N·T_dec) }  (tokens/s per GPU)

m_r is the mean KV per request (bytes); t_compute + t_comm the decode iteration time at batch M/m_r;
B the batch whose iteration takes T_dec. N* = argmax T_max over powers of two ≤ gpus_per_node with
M > 0 (ties to the smaller N); it does not depend on the arrival rate.

M is the paper's N·m_gpu − m_model with what a serving engine really keeps for KV: the memory fraction
f it may use (vLLM's gpu_memory_utilization, 0.9) and its peak activations m_act reserved — the same
pool the simulator gives an instance (:func:`llmfleet.costmodel.memory.kv_pool_bytes`: the engine
defaults, or the pool's engines' settings, :class:`~llmfleet.policies.placement.adapter_costs.InstanceMemory`),
so a worker sized here holds exactly the KV its simulated (or live, at those settings) instance has.

Resolutions: the iteration time t_compute + t_comm defaults to the decode iteration of the default
cost source (``costmodel.latency_model.decode_iteration_time``: what the simulator and the emulated
engines charge, per-iteration overhead included), at the mean context m_r/bytes-per-token; pass
``iteration_time(n, batch, context)`` to use another (a fitted ``TpModel``, the roofline of
:func:`roofline_iteration_time`). B is solved continuously by bisection. The roofline alone has no
fixed per-iteration cost (the paper's c4: kernel launches, scheduler), so it favours larger N than the
paper reports (see ``optimal_tp``).

:class:`AladdinWorkers` gives every model workers of its own N* GPUs: one each first, then each
further worker to the model with the highest demand per GPU already given (D'Hondt, ties by name),
while a whole worker still fits. Demand of a model = Σ over its services of rate × mean work, with mean
work = mean output tokens / T_max(N*) GPU-seconds per request (decode dominates; an unknown output
length counts as half of ``default_seq_tokens``). Instances are ``"{model}-{i}"``, models by name.

LoRA adapters (``GpuPool.adapter_slots`` > 0; :mod:`~llmfleet.policies.placement.adapter_costs`): M loses
the adapter pool the engine reserves beside the base, and a base whose services name adapters pays the
batched LoRA computation of its adapter rows in every decode iteration, so T_max(N) — and with it
Aladdin's worker count — is that of the base serving its adapters, not of the bare base.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from llmfleet.costmodel.hardware import Hardware, hardware
from llmfleet.costmodel.latency_model import decode_iteration_time
from llmfleet.costmodel.memory import (
    DEFAULT_MAX_BATCH_REQUESTS,
    DEFAULT_MAX_PREFILL_TOKENS,
    DEFAULT_MEM_FRACTION,
    kv_pool_bytes,
)
from llmfleet.costmodel.models import ModelArch, model_arch
from llmfleet.costmodel.roofline import decode_time
from llmfleet.policies.placement.adapter_costs import (
    InstanceMemory,
    IterationTime,
    adapter_traffic,
    with_lora,
)
from llmfleet.policies.placement.base import (
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementInfeasible,
    PlacementNeeds,
    PlannerReport,
    ServiceLoad,
)
from llmfleet.policies.placement.dedicated_even import pool_note

# Aladdin Table 2: ATGT SLO (s) by model and GPU family; used when the planner is given none.
PAPER_T_DEC: dict[tuple[str, str], float] = {
    ("llama2-70b", "a100"): 0.075,
    ("llama2-13b", "a100"): 0.030,
    ("llama2-13b", "v100"): 0.050,
    ("llama2-7b", "a100"): 0.015,
    ("llama2-7b", "v100"): 0.030,
}


def _t_dec(slo: Any) -> float:
    if hasattr(slo, "tpot_s"):
        return float(slo.tpot_s)
    if isinstance(slo, (tuple, list)):
        return float(slo[1])
    return float(slo)


def _roofline(arch: ModelArch, hw: Hardware) -> IterationTime:
    return lambda n, batch, ctx: decode_time(arch, hw, batch, ctx, n)


def with_overhead(it: IterationTime, overhead: Callable[[float, int], float]) -> IterationTime:
    """``it`` plus a per-iteration overhead(batch, n) (e.g. ``costmodel.overhead.VIDUR_A100_OVERHEAD``):
    the paper's fixed cost c4 that the roofline lacks, so that N* trades it against the weight read."""
    return lambda n, batch, ctx: it(n, batch, ctx) + overhead(batch, n)


def roofline_iteration_time(arch: ModelArch, hw: Hardware, overhead=None) -> IterationTime:
    """The roofline decode iteration, plus ``overhead(batch, n)`` if given."""
    it = _roofline(arch, hw)
    return it if overhead is None else with_overhead(it, overhead)


def kv_capacity(
    arch: ModelArch,
    hw: Hardware,
    n: int,
    mem_fraction: float = DEFAULT_MEM_FRACTION,
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
    max_batch_requests: int = DEFAULT_MAX_BATCH_REQUESTS,
) -> float:
    """M = N·m_gpu·f − m_model − m_act in bytes, the simulator's KV pool (≤ 0: the model does not fit)."""
    return float(kv_pool_bytes(hw, n, [arch], mem_fraction, max_prefill_tokens, max_batch_requests))


def paper_kv_capacity(arch: ModelArch, hw: Hardware, n: int) -> float:
    """The paper's literal M = N·m_gpu − m_model (all memory, no activations): Table 3's assumption."""
    return float(n * hw.mem_bytes - arch.weight_bytes)


def kv_room(
    arch: ModelArch, hw: Hardware, n: int, paper_memory: bool = False, memory: InstanceMemory | None = None
) -> float:
    """M of an N-GPU worker: the engine's pool (``memory``'s engines, else the defaults:
    :func:`kv_capacity`), or with ``paper_memory`` the paper's N·m_gpu − m_model less ``memory``'s
    adapter pool."""
    if paper_memory:
        return paper_kv_capacity(arch, hw, n) - (memory.pool_bytes(arch) if memory is not None else 0)
    return float(memory.kv_bytes(n, [arch])) if memory is not None else kv_capacity(arch, hw, n)


def slo_batch(it: IterationTime, n: int, t_dec: float, context: float) -> float:
    """B: the (continuous) batch whose decode iteration takes t_dec; 0 if even batch 1 is slower."""
    if it(n, 1.0, context) > t_dec:
        return 0.0
    lo, hi = 1.0, 2.0
    while hi < 1e7 and it(n, hi, context) <= t_dec:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if it(n, mid, context) <= t_dec else (lo, mid)
    return lo


def worker_throughput(
    arch: ModelArch,
    hw: Hardware,
    n: int,
    t_dec: float,
    mean_kv_per_request: float,
    iteration_time: IterationTime | None = None,
    *,
    paper_memory: bool = False,
    memory: InstanceMemory | None = None,
) -> float:
    """T_max(N) of Eq. 6 in tokens/s per GPU (0 when the weights do not fit or no batch meets T_dec).
    ``paper_memory``: M = N·m_gpu − m_model as printed, instead of the engine's pool;
    ``memory``: the pool's engines (their memory fraction, batch limits and adapter pool) instead of the
    engine defaults."""
    m = kv_room(arch, hw, n, paper_memory, memory)
    if m <= 0:
        return 0.0
    it = iteration_time or decode_iteration_time(arch, hw)
    context = mean_kv_per_request / arch.kv_bytes_per_token
    batch_kv = m / mean_kv_per_request
    kv_bound = batch_kv / (n * it(n, batch_kv, context))
    slo_bound = slo_batch(it, n, t_dec, context) / (n * t_dec)
    return min(kv_bound, slo_bound)


def optimal_tp(
    arch: ModelArch | str,
    hw: Hardware | str,
    slo: Any,
    mean_kv_per_request: float,
    *,
    gpus_per_node: int | None = None,
    iteration_time: IterationTime | None = None,
    paper_memory: bool = False,
    memory: InstanceMemory | None = None,
) -> int:
    """N* = argmax over powers of two N ≤ gpus_per_node of T_max(N) (Eq. 6); ties to the smaller N.

    ``slo`` is T_dec in seconds, a (T_pre, T_dec) pair or an object with ``tpot_s``;
    ``mean_kv_per_request`` is m_r in bytes. With the default cost source on the catalog a100-80gb at
    m_r = 512 tokens of KV and Table 2's SLOs this gives 70B→4, 13B→1, 7B→1 (paper: 2, 1, 1 on PCIe
    A100s with fitted models; with the engine's real pool two A100s leave a 70B ~14 GiB of KV, so its
    KV bound moves N* to 4). On the roofline alone, which lacks the fixed iteration cost that favours
    N = 1, all three → 4.
    Raises ValueError when no N fits the weights and meets T_dec.
    """
    a = model_arch(arch) if isinstance(arch, str) else arch
    h = hardware(hw) if isinstance(hw, str) else hw
    if mean_kv_per_request <= 0:
        raise ValueError(f"mean_kv_per_request must be > 0, got {mean_kv_per_request}")
    t_dec = _t_dec(slo)
    top = gpus_per_node or h.gpus_per_node
    best_n, best = 0, 0.0
    n = 1
    while n <= top:
        t = worker_throughput(
            a, h, n, t_dec, mean_kv_per_request, iteration_time,
            paper_memory=paper_memory, memory=memory,
        )  # fmt: skip
        if t > best:
            best_n, best = n, t
        n *= 2
    if best_n == 0:
        raise ValueError(
            f"{a.name} on {h.name}: no worker of ≤ {top} GPUs holds the weights and meets T_dec={t_dec}s"
        )
    return best_n


def paper_t_dec(model: str, hw: Hardware) -> float | None:
    family = hw.name.split("-")[0]
    return PAPER_T_DEC.get((model_arch(model).name, family))


@dataclass(frozen=True)
class AladdinWorkersOptions:
    """Eq. 6's options.

    Args:
        t_dec: ATGT SLO in seconds, one for all models or per model; default the strictest ``slo.tpot_s``
            of the model's services (the live config's SLO), else Table 2 of the paper.
        default_seq_tokens: l_in + l_out assumed for services that give no lengths.
        iteration_time: model -> IterationTime override (default: roofline of the catalog entries).
    """

    t_dec: float | Mapping[str, float] | None = None
    default_seq_tokens: float = 512.0
    iteration_time: Mapping[str, IterationTime] | None = None

    def __post_init__(self) -> None:
        if self.default_seq_tokens <= 0:
            raise ValueError(f"default_seq_tokens must be > 0, got {self.default_seq_tokens}")


class AladdinWorkers(PlannerReport):
    """Workers of N* GPUs per model (Eq. 6) with ``options``, GPUs split by demand; see the module
    docstring."""

    name = "aladdin_workers"
    needs = PlacementNeeds()
    Options: ClassVar[type[AladdinWorkersOptions]] = AladdinWorkersOptions

    def __init__(self, options: AladdinWorkersOptions | None = None) -> None:
        o = options if options is not None else AladdinWorkersOptions()
        self.t_dec = o.t_dec
        self.default_seq_tokens = float(o.default_seq_tokens)
        self.iteration_time = dict(o.iteration_time or {})

    def decode_slo(self, model: str, hw: Hardware, services: Sequence[ServiceLoad]) -> float:
        """T_dec of ``model`` (seconds per output token): the ``t_dec`` option, else the strictest
        ``slo.tpot_s`` of its services, else Aladdin's Table 2; PlacementInfeasible when none."""
        t = self.t_dec.get(model) if isinstance(self.t_dec, Mapping) else self.t_dec
        if t is None:
            t = min((s.slo.tpot_s for s in services if s.slo.tpot_s is not None), default=None)
        if t is None:
            t = paper_t_dec(model, hw)
        if t is None:
            raise PlacementInfeasible(
                f"model {model!r}: no T_dec given, no service of it sets slo.tpot_s, none in Aladdin's Table 2"
            )
        return float(t)

    def worker_config(self, gpus: GpuPool, services: Sequence[ServiceLoad]) -> dict[str, dict[str, float]]:
        """Per model: tp (N*), throughput T_max(N*) per GPU, m_r (bytes) and demand (GPUs, relative);
        with LoRA on, priced with the adapter pool and its adapters' computation (module docstring)."""
        hw = hardware(gpus.hardware)
        memory = InstanceMemory.of(gpus)
        traffic = adapter_traffic(services)
        by_model: dict[str, list[ServiceLoad]] = {}
        for s in services:
            by_model.setdefault(s.model, []).append(s)
        out: dict[str, dict[str, float]] = {}
        for m in sorted(by_model):
            arch = model_arch(m)
            svcs = by_model[m]
            weight = sum(s.rate_rps for s in svcs)
            lens = [
                (s.rate_rps if weight > 0 else 1.0, s.mean_prompt_tokens + s.mean_output_tokens)
                for s in svcs
                if s.mean_prompt_tokens + s.mean_output_tokens > 0
            ]
            w = sum(x for x, _ in lens)
            seq = sum(x * ln for x, ln in lens) / w if w > 0 else self.default_seq_tokens
            m_r = seq * arch.kv_bytes_per_token
            t_dec = self.decode_slo(m, hw, svcs)
            it = self.iteration_time.get(m)
            if m in traffic and memory.adapter_slots:
                it = with_lora(it or decode_iteration_time(arch, hw), arch, memory, traffic[m])
            pool = memory.pool_bytes(arch)
            try:
                n = optimal_tp(
                    arch, hw, t_dec, m_r, gpus_per_node=gpus.gpus_per_node, iteration_time=it,
                    memory=memory,
                )  # fmt: skip
            except ValueError as e:
                raise PlacementInfeasible(f"model {m!r}: {e}{pool_note(pool)}") from None
            tput = worker_throughput(arch, hw, n, t_dec, m_r, it, memory=memory)
            work = sum(
                s.rate_rps * (s.mean_output_tokens or self.default_seq_tokens / 2) for s in svcs
            )  # output tokens/s
            out[m] = {"tp": n, "throughput": tput, "mean_kv_bytes": m_r, "demand": work / tput}
        return out

    def place(
        self, gpus: GpuPool, services: Sequence[ServiceLoad], context: PlacementContext | None = None
    ) -> list[InstancePlan]:
        cfg = self.worker_config(gpus, services)
        if not cfg:
            return []
        tp = {m: int(c["tp"]) for m, c in cfg.items()}
        need = sum(tp.values())
        if need > gpus.count:
            raise PlacementInfeasible(
                f"one worker per model needs {need} GPUs ({', '.join(f'{m}: {tp[m]}' for m in tp)}) "
                f"but the pool has {gpus.count}"
            )
        demand = {m: c["demand"] for m, c in cfg.items()}
        if not any(d > 0 for d in demand.values()):
            demand = dict.fromkeys(demand, 1.0)
        workers = dict.fromkeys(tp, 1)
        left = gpus.count - need
        while True:
            fits = [m for m in tp if tp[m] <= left]
            if not fits:
                break
            m = min(fits, key=lambda k: (-demand[k] / (workers[k] * tp[k]), k))
            workers[m] += 1
            left -= tp[m]
        return [InstancePlan(f"{m}-{i}", (m,), tp[m]) for m in sorted(tp) for i in range(workers[m])]
