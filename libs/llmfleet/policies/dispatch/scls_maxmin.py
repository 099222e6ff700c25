"""SCLS max-min offloading and adaptive schedule interval (Cheng et al. 2024, §4.5–4.6).

* Eq. 11: batches in descending estimated serve time, each to the worker with the least load;
  T_load(w) += T_serve(N, L_i, S). When a worker finishes a batch its load drops by the batch's
  **estimate**, not the measured time, so estimation errors do not accumulate (§4.5).
* Eq. 12: the scheduling interval T ← max(λ·min_w T_load(w), Γ); λ = 0.5, Γ = 6 s (HF) / 3 s (DeepSpeed).

Two entry points share the loads:

* :meth:`SclsMaxMin.assign_batches` — the paper's batch-level offloading (batches from
  ``SclsSliceBatcher.plan`` or ``dp_batches``); :meth:`SclsMaxMin.complete_batch` subtracts a batch's
  estimate and :meth:`SclsMaxMin.interval` gives the next scheduling interval. The simulator's central
  mode (``llmfleet.sim.scls_central``, dispatch ``scls_central``) drives these three every interval.
* :meth:`SclsMaxMin.choose` — the cluster dispatch interface (one request at a time): the request goes
  to the eligible engine with the least load (ties: smaller engine id) and adds its estimate there;
  :meth:`SclsMaxMin.on_finish` (a ``FinishListener``: the simulator and scheduler call it when a
  placement ends, whatever the outcome) subtracts it.

A request's estimate (resolved ambiguity: the paper only estimates batches): the time it would take
alone, slice by slice, under the paper's recompute mode — with L = ``prompt_tokens``, P =
``predicted_output_tokens`` (P ≤ 0: unknown, taken as one full slice) and K = ⌈P/S⌉ slices,
est = Σ_{k<K} T_serve(1, L + k·S, min(S, P − k·S)). Standalone time overstates a request's share of a
large batch, but it is consistent across engines, which is all the least-load comparison needs. Without
a request (``request=None``) the estimate is one slice of an empty prompt, T_serve(1, 0, S), so loads
still grow (and, with no request id, never shrink: pass the request). Engines never seen have load 0. Loads are clamped at 0 after a subtraction (float residue).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from llmfleet.policies.batching.scls_dp import SliceCost, as_scls_cost
from llmfleet.policies.checks import positive_int
from llmfleet.policies.dispatch.base import (
    DispatchNeeds,
    DispatchRequest,
    EngineCandidate,
    FinishListener,
    eligible,
)

B = TypeVar("B", bound=Hashable)

GAMMA_HF_S = 6.0
GAMMA_DEEPSPEED_S = 3.0
MAX_SLICES = 4096  # bound on the per-request slice sum (a guard against absurd predictions)


def adaptive_interval(loads: Iterable[float], lam: float = 0.5, gamma_s: float = GAMMA_HF_S) -> float:
    """Eq. 12: max(λ·min_w T_load(w), Γ); Γ when there is no worker."""
    lo = min(loads, default=None)
    return gamma_s if lo is None else max(lam * lo, gamma_s)


@dataclass(frozen=True)
class SclsMaxMinOptions:
    """``cost`` prices a slice (a :class:`~llmfleet.policies.batching.scls_dp.SliceCost` or its
    mapping); ``slice_iterations`` is the slice length; ``lam`` (λ) and ``gamma_s`` (Γ) give the
    adaptive interval max(λ·min load, Γ)."""

    cost: SliceCost | Mapping[str, Any] | None = None
    slice_iterations: int = 128
    lam: float = 0.5
    gamma_s: float = GAMMA_HF_S

    def __post_init__(self) -> None:
        positive_int("slice_iterations", self.slice_iterations)
        if not (isinstance(self.lam, int | float) and 0 < self.lam <= 1):
            raise ValueError(f"lam must be in (0, 1], got {self.lam!r}")
        if not (isinstance(self.gamma_s, int | float) and self.gamma_s >= 0):
            raise ValueError(f"gamma_s must be >= 0, got {self.gamma_s!r}")


class SclsMaxMin(FinishListener):
    """Max-min offloading by estimated serve time (load −= the estimate on completion)."""

    name = "scls_maxmin"
    # predicted lengths (the scheduler asks the profiler) and its own books of estimated serve time, not
    # the engines' load; it hears every end of a placement (FinishListener)
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(reads_predictions=True)

    Options: ClassVar[type[SclsMaxMinOptions]] = SclsMaxMinOptions

    def __init__(self, options: SclsMaxMinOptions | None = None) -> None:
        o = options if options is not None else SclsMaxMinOptions()
        self.cost = as_scls_cost(o.cost)
        self.slice_iterations = o.slice_iterations
        self.lam = float(o.lam)
        self.gamma_s = float(o.gamma_s)
        self.loads: dict[str, float] = {}
        self._requests: dict[str, tuple[str, float]] = {}  # request id → (engine, estimate)
        self._batches: dict[Hashable, tuple[str, float]] = {}  # batch → (worker, estimate)

    # ------------------------------------------------------------------------------------ loads

    def load(self, worker: str) -> float:
        return self.loads.get(worker, 0.0)

    def _add(self, worker: str, est: float) -> None:
        self.loads[worker] = self.load(worker) + est

    def _sub(self, worker: str, est: float) -> None:
        self.loads[worker] = max(0.0, self.load(worker) - est)

    def interval(self, workers: Iterable[str] | None = None) -> float:
        """Eq. 12 over ``workers`` (default: every worker seen so far)."""
        names = list(self.loads) if workers is None else list(workers)
        return adaptive_interval((self.load(w) for w in names), self.lam, self.gamma_s)

    # ------------------------------------------------------------------------------ estimates

    def request_estimate(self, request: DispatchRequest | None) -> float:
        """Standalone slice-by-slice serve time of one request (see the module docstring)."""
        s = self.slice_iterations
        if request is None:
            return float(self.cost.t_serve(1, 0, s))
        pred = float(request.predicted_output_tokens)
        if not (pred > 0 and math.isfinite(pred)):
            return float(self.cost.t_serve(1, request.prompt_tokens, s))
        k_slices = min(math.ceil(pred / s), MAX_SLICES)
        total = 0.0
        for k in range(k_slices):
            iters = max(1, min(s, math.ceil(pred - k * s)))
            total += self.cost.t_serve(1, request.prompt_tokens + k * s, iters)
        return float(total)

    # ------------------------------------------------------------------------------ batch level

    def assign_batches(
        self,
        batches_with_estimates: Sequence[tuple[B, float]],
        workers: Sequence[str],
        credit: Callable[[B, str], float] | None = None,
    ) -> list[tuple[B, str]]:
        """Eq. 11: longest estimate first (ties keep input order) to the least-loaded worker (ties: first in
        ``workers``); returns ``(batch, worker)`` in assignment order and records each for
        :meth:`complete_batch`. ``credit(batch, worker)`` (an extension, default none): seconds the batch
        would save on that worker (e.g. re-prefill avoided where its rows' KV is kept); the batch goes to
        the worker minimising load − credit, and the load still grows by the full estimate."""
        if not workers:
            raise ValueError("assign_batches needs at least one worker")
        order = sorted(range(len(batches_with_estimates)), key=lambda i: -batches_with_estimates[i][1])
        out: list[tuple[B, str]] = []
        for i in order:
            batch, est = batches_with_estimates[i]
            worker = self._least_loaded(workers, batch, credit)
            self._add(worker, est)
            self._batches[batch] = (worker, est)
            out.append((batch, worker))
        return out

    def _least_loaded(
        self, workers: Sequence[str], batch: B, credit: Callable[[B, str], float] | None
    ) -> str:
        """The worker with the least load (less ``credit(batch, worker)`` when given); ties: first."""
        if credit is None:
            return min(workers, key=self.load)
        return min(workers, key=lambda w: self.load(w) - credit(batch, w))

    def complete_batch(self, batch: Hashable) -> None:
        """The worker finished ``batch``: its load drops by the batch's estimate (unknown batch: no-op)."""
        rec = self._batches.pop(batch, None)
        if rec is not None:
            self._sub(*rec)

    # ------------------------------------------------------------------------------ request level

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
    ) -> str:
        pool = eligible(model, candidates, exclude)
        best = min(pool, key=lambda c: self.load(c.engine_id)).engine_id  # first of ties: smallest id
        est = self.request_estimate(request)
        if request is not None:
            old = self._requests.pop(request.request_id, None)
            if old is not None:  # re-dispatch of the same request (e.g. after an engine failure)
                self._sub(*old)
            self._requests[request.request_id] = (best, est)
        self._add(best, est)
        return best

    def on_finish(self, request_id: str, engine_id: str, output_tokens: int, now: float) -> None:
        """The request completed: subtract the estimate added at dispatch from the engine it was
        dispatched to (``engine_id``/``output_tokens``/``now`` are not needed: load −= estimate)."""
        del engine_id, output_tokens, now
        rec = self._requests.pop(request_id, None)
        if rec is not None:
            self._sub(*rec)
