"""Aladdin's joint worker sizing and scaling (§4.1 Eq. 6, §5.2 Eq. 7) as a fleet planner.

Per model m (its services' rates r_m summed):

* worker size N_g*(m) = argmax_N T_max(N) (Eq. 6, :func:`~llmfleet.policies.placement.aladdin_workers.
  optimal_tp`), the same pool arithmetic M = N·m_gpu − m_model the simulator's memory plan uses;
* worker count N_w(m) = max(min_workers, ⌈k5·r_m + c5⌉) (Eq. 7, :class:`AladdinLinearScaler`). k5, c5
  come from fitting (``llmfleet.sim.capacity.fit_worker_scaler`` replays best-fit placement offline at
  several rates) or the options; without them k5 = l̄_out / (N_g*·T_max(N_g*)) and c5 = 0 — a worker's
  SLO-bound decode capacity from Eq. 6, i.e. the count the throughput model alone gives;
* scale-out: when best-fit dispatch found no feasible worker for requests of m since the last plan
  (``context.infeasible[m] > 0``, the paper opens a new worker), m gets at least one worker more
  than it has in ``context.current``;
* scale-in follows the linear law as the rate falls (never below ``min_workers``).

When the pool cannot hold every model's count, each model keeps one worker and the remaining GPUs go
by D'Hondt on the wanted counts (largest unmet share first); the plan says so in ``last_reason``.
Instances are ``"{model}-{i}"``; ``PlacementInfeasible`` when one worker per model does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from llmfleet.policies.placement.aladdin_workers import AladdinWorkers, AladdinWorkersOptions, IterationTime
from llmfleet.policies.placement.base import (
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementInfeasible,
    PlacementNeeds,
    PlannerReport,
    ServiceLoad,
)
from llmfleet.policies.scaling.aladdin_linear import AladdinLinearScaler

PerModel = float | Mapping[str, float] | None


def _per_model(value: PerModel, model: str) -> float | None:
    if isinstance(value, Mapping):
        v = value.get(model)
        return None if v is None else float(v)
    return None if value is None else float(value)


@dataclass(frozen=True)
class AladdinOptions:
    """Eq. 6 and 7's options.

    Args:
        k5, c5: Eq. 7's slope (workers per req/s) and intercept, one for all models or per model.
        min_rate: R of Eq. 7 (below it the count at R is used).
        min_workers: workers kept per model even without traffic.
        t_dec, default_seq_tokens, iteration_time: :class:`AladdinWorkersOptions` (Eq. 6).
    """

    k5: PerModel = None
    c5: PerModel = None
    min_rate: float = 0.0
    min_workers: int = 1
    t_dec: float | Mapping[str, float] | None = None
    default_seq_tokens: float = 512.0
    iteration_time: Mapping[str, IterationTime] | None = None

    def __post_init__(self) -> None:
        if self.min_workers < 1:
            raise ValueError(
                f"min_workers must be >= 1 (a model needs a worker to be served), got {self.min_workers}"
            )
        AladdinWorkersOptions(self.t_dec, self.default_seq_tokens, self.iteration_time)  # checked there


class AladdinPlanner(PlannerReport):
    """N_g* per model and N_w = ⌈k5·r + c5⌉ workers of it, with ``options``; see the module docstring."""

    name = "aladdin"
    needs = PlacementNeeds()
    Options: ClassVar[type[AladdinOptions]] = AladdinOptions

    def __init__(self, options: AladdinOptions | None = None) -> None:
        o = options if options is not None else AladdinOptions()
        self.k5, self.c5 = o.k5, o.c5
        self.min_rate = float(o.min_rate)
        self.min_workers = int(o.min_workers)
        self.sizing = AladdinWorkers(AladdinWorkersOptions(o.t_dec, o.default_seq_tokens, o.iteration_time))
        self.last_reason = ""
        self.last_counts: dict[str, int] = {}

    def scaler(self, model: str, derived_k5: float) -> AladdinLinearScaler:
        """The Eq. 7 scaler of ``model`` (the configured k5/c5, else the Eq. 6 throughput slope)."""
        k5 = _per_model(self.k5, model)
        c5 = _per_model(self.c5, model)
        return AladdinLinearScaler(
            derived_k5 if k5 is None else k5, c5 or 0.0, self.min_rate, self.min_workers
        )

    def wanted(
        self, gpus: GpuPool, services: Sequence[ServiceLoad], context: PlacementContext
    ) -> tuple[dict[str, int], dict[str, int], dict[str, str]]:
        """Per model: worker size, wanted worker count and why."""
        cfg = self.sizing.worker_config(gpus, services)
        rate: dict[str, float] = {}
        out_tokens: dict[str, float] = {}
        for s in services:
            rate[s.model] = rate.get(s.model, 0.0) + s.rate_rps
            out_tokens[s.model] = out_tokens.get(s.model, 0.0) + s.rate_rps * (
                s.mean_output_tokens or self.sizing.default_seq_tokens / 2
            )
        have: dict[str, int] = {}
        for p in context.current:
            for m in p.models:
                have[m] = have.get(m, 0) + 1
        size, count, why = {}, {}, {}
        for m, c in cfg.items():
            tp = int(c["tp"])
            per_worker = c["throughput"] * tp  # tokens/s one worker sustains within T_dec (Eq. 6)
            mean_out = out_tokens[m] / rate[m] if rate[m] > 0 else self.sizing.default_seq_tokens / 2
            n = self.scaler(m, mean_out / per_worker if per_worker > 0 else math.inf).workers(rate[m])
            reason = f"⌈k5·{rate[m]:.2f} + c5⌉ → {n}"
            if context.infeasible.get(m, 0) > 0 and n <= have.get(m, 0):
                n = have[m] + 1
                reason = f"scale-out: {context.infeasible[m]} requests found no feasible worker → {n}"
            size[m], count[m], why[m] = tp, n, reason
        return size, count, why

    def place(
        self, gpus: GpuPool, services: Sequence[ServiceLoad], context: PlacementContext | None = None
    ) -> list[InstancePlan]:
        ctx = context or PlacementContext()
        if not services:
            self.last_reason, self.last_counts = "no services", {}
            return []
        size, want, why = self.wanted(gpus, services, ctx)
        need = sum(size.values())
        if need > gpus.count:
            raise PlacementInfeasible(
                f"one worker per model needs {need} GPUs ({', '.join(f'{m}: tp={size[m]}' for m in size)}) "
                f"but the pool has {gpus.count}"
            )
        count = dict.fromkeys(size, 1)
        left = gpus.count - need
        capped = False
        while True:
            short = [m for m in size if count[m] < want[m]]
            if not short:
                break
            fits = [m for m in short if size[m] <= left]
            if not fits:
                capped = True
                break
            m = min(fits, key=lambda k: (-want[k] / count[k], k))  # D'Hondt on the wanted counts
            count[m] += 1
            left -= size[m]
        self.last_counts = count
        parts = [f"{m}: {count[m]}×tp{size[m]} ({why[m]})" for m in sorted(size)]
        self.last_reason = "; ".join(parts) + (" — capped by the pool" if capped else "")
        return [InstancePlan(f"{m}-{i}", (m,), size[m]) for m in sorted(size) for i in range(count[m])]
