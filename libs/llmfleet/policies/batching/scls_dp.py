"""SCLS slice-level scheduling: the serving-time-oriented DP batcher (Cheng et al., "Slice-Level
Scheduling for High Throughput and Load Balanced LLM Serving", 2024, §4.4 Algorithm 1).

Every batch runs for at most S iterations (a slice, ``max_iterations=S``); unfinished requests come back
to ``waiting`` with their output folded into ``prompt_tokens`` (the paper's recompute mode) and are
re-batched with new arrivals.

The DP (:func:`dp_batches`, Eq. 10): sort the requests by input length ascending; T[0] = 0;
T[i] = min_{0<j≤i} T[j−1] + T_serve(i−j+1, L_i, S), where L_i (the i-th length) is the padded length
of the run j..i. Runs grow backwards from i and stop at the first OOM; a single request is always
allowed (Algorithm 1 line 10 has no OOM check). Backtracking the split points gives the batches.

Resolved ambiguities:

* OOM / run bound: ``fits(n, L)`` must be monotone (true → … → false as n grows), as the memory test
  N·Δ·(L+S) ≤ ζ·M_ava (Eq. 9) is. The paper's linear "stop at the first OOM" scan is then the same as
  N ≤ N_max(L) (Eq. 8), found here by binary search, so the DP costs O(n·N_max) (plus O(n log N_max)
  ``fits`` calls) instead of O(n²).
* Ties: Algorithm 1 tries the single batch first and replaces only on a strictly smaller time, so among
  equal totals the shortest last run wins; :func:`dp_batches` keeps that order.
* Memory in this codebase is blocks, not bytes: a run of n rows padded to L needs
  ``n · blocks_for(L + S)`` blocks (``padded_blocks(pool, members, S)``), against
  ⌊ζ · pool.available_blocks⌋ (the pool already nets out weights and engine memory: M_ava of Eq. 6).
  ζ = 0.9 is the paper's HF setting; ζ = 1 suits a paged KV pool without fragmentation. The engine's
  ``BatchLimits`` (``max_requests``, padded prefill ``n·L ≤ max_prefill_tokens``) and an optional
  ``max_batch`` bound runs too; the single-request run is exempt from all of them, but a request whose
  padded admission ``padded_blocks(pool, [r], 1)`` does not fit at all cannot run and is left out.
  The engine limits are this engine-local batcher's, not the paper's (it bounds memory only): an engine
  that forms its own batches must respect its prefill budget. The paper's central scheduler
  (``llmfleet.sim.scls_central``: a pool, :func:`dp_batches` every interval, ``SclsMaxMin.assign_batches``)
  calls :func:`dp_batches` with the memory bound alone (the prefill cap is an option there).
* One model per batch: the DP runs over the waiting requests of the model of the oldest waiting request
  that can run (as :class:`~llmfleet.policies.batching.static_sls.StaticSls` picks its model).
* One batch per ``form_batch`` call: the paper partitions everything fetched in an interval and queues
  all batches; an engine-local batcher runs one batch at a time, so it returns **the batch that holds
  the oldest waiting request** (of that model). On one instance max-min ordering does not apply (it
  balances across workers; see ``dispatch/scls_maxmin.py``), and oldest-first bounds every request's
  wait by the number of older requests: no starvation of long prompts. The rest of the partition is
  kept and served by later calls while the waiting set (ids and prompt lengths), the free blocks and the
  limits are unchanged; any change (an arrival, a slice's unfinished requests returning) recomputes it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, Protocol

import numpy as np

from llmfleet.costmodel.hardware import hardware
from llmfleet.costmodel.latency_model import cost_record
from llmfleet.costmodel.models import model_arch
from llmfleet.costmodel.scls import SclsDecode, SclsModel, SclsPrefill
from llmfleet.policies.batching.base import StaticBatch, mark_batch_ran, padded_blocks
from llmfleet.policies.checks import positive_int
from llmfleet.policies.request.base import (
    BatchLimits,
    PoolView,
    SchedRequest,
    arrival_key,
    check_duration,
)


class SliceCost(Protocol):
    """What the batcher needs of a cost model: T_serve(N, L_i, S) in seconds (Eq. 1–4)."""

    def t_serve(self, n: int, l_in: int, s: int) -> float: ...


@lru_cache(maxsize=1)
def default_scls_cost() -> SclsModel:
    """The paper's setting when no profile is given: LLaMA2-13B on one A100-80GB, the SCLS forms fitted
    to the default cost source (``costmodel.cost_record``), the costs the simulator charges."""
    rec = cost_record(model_arch("llama2-13b"), hardware("a100-80gb"), date="1970-01-01T00:00:00")
    return SclsModel(rec.scls.prefill, rec.scls.decode)


def as_scls_cost(cost: SliceCost | Mapping[str, Any] | None) -> SliceCost:
    """``None`` → :func:`default_scls_cost`; a mapping ``{"prefill": {p1..p4}, "decode": {d1..d4}}`` (a
    profile record's ``scls`` section) → :class:`SclsModel`; anything with ``t_serve`` is used as is."""
    if cost is None:
        return default_scls_cost()
    if isinstance(cost, Mapping):
        return SclsModel(SclsPrefill(**cost["prefill"]), SclsDecode(**cost["decode"]))
    if not callable(getattr(cost, "t_serve", None)):
        raise ValueError(f"cost must have t_serve(n, l_in, s), got {type(cost).__name__}")
    return cost


def _max_run(fits: Callable[[int, int], bool], length: int, limit: int) -> int:
    """Largest n in [1, limit] with fits(n, length) (1 when none: a single request is always allowed).
    ``fits`` is monotone in n, so gallop then bisect."""
    if limit <= 1 or not fits(2, length):
        return 1
    lo, hi = 2, 4  # fits(lo) holds
    while hi <= limit and fits(hi, length):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)  # fits(hi) is false or hi is past the limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid, length):
            lo = mid
        else:
            hi = mid
    return lo


def _cost_matrix(
    t_serve: Callable[[Any, Any], Any], lengths: Sequence[int], widths: Sequence[int]
) -> np.ndarray:
    """C[i, n−1] = t_serve(n, lengths[i]) for n = 1..widths[i]: one broadcast call when ``t_serve`` is
    plain arithmetic (as SclsModel.t_serve is), spot-checked against scalar calls; else scalar calls
    (entries past a row's width are +inf and never read)."""
    width = max(widths)
    ns = np.arange(1, width + 1, dtype=np.float64)
    ls = np.asarray(lengths, dtype=np.float64)
    try:
        with np.errstate(all="ignore"):
            mat = np.asarray(t_serve(ns[None, :], ls[:, None]), dtype=np.float64)
        if mat.shape == (len(ls), width):
            corners = [(0, 0), (len(ls) - 1, widths[-1] - 1), (len(ls) // 2, (widths[len(ls) // 2] - 1) // 2)]
            if all(
                math.isclose(mat[i, k], float(t_serve(k + 1, lengths[i])), rel_tol=1e-9) for i, k in corners
            ):
                return mat
    except (TypeError, ValueError, AttributeError):
        pass
    mat = np.full((len(ls), width), np.inf)
    for i, (ln, w) in enumerate(zip(lengths, widths, strict=True)):
        mat[i, :w] = [float(t_serve(n, ln)) for n in range(1, w + 1)]
    return mat


def dp_batches(
    lengths: Sequence[int],
    t_serve: Callable[[int, int], float],
    fits: Callable[[int, int], bool],
) -> list[list[int]]:
    """SCLS Algorithm 1: partition requests into contiguous runs of the length-sorted order minimising
    Σ T_serve(|run|, L_last, S) (Eq. 10).

    ``lengths[k]``: input length of request k; ``t_serve(n, L)``: serve time of n rows padded to L (S is
    bound by the caller); ``fits(n, L)``: n rows padded to L fit (monotone in n; never asked for n = 1).
    Returns lists of indices into ``lengths``, batches in ascending length order, each ascending (ties in
    length keep index order). O(n·N_max) cost evaluations.
    """
    n = len(lengths)
    if n == 0:
        return []
    order = sorted(range(n), key=lambda k: (lengths[k], k))
    ls = [int(lengths[k]) for k in order]
    nmax: dict[int, int] = {}
    width = [0] * n
    for i, ln in enumerate(ls):  # i is 0-based here: at most i + 1 requests end at position i
        if ln not in nmax:
            nmax[ln] = _max_run(fits, ln, n)
        width[i] = min(i + 1, nmax[ln])
    cost = _cost_matrix(t_serve, ls, width)
    best = np.zeros(n + 1)  # T[0..n]
    run = [0] * (n + 1)  # length of the last run of the best partition of the first i requests
    for i in range(1, n + 1):
        w = width[i - 1]
        cand = best[i - w : i][::-1] + cost[i - 1, :w]  # cand[k] = T[i−k−1] + T_serve(k+1, L_i)
        k = int(np.argmin(cand))  # first minimum: the shortest run among ties (Algorithm 1)
        best[i] = cand[k]
        run[i] = k + 1
    out: list[list[int]] = []
    i = n
    while i > 0:
        out.append([order[k] for k in range(i - run[i], i)])
        i -= run[i]
    out.reverse()
    return out


@dataclass(frozen=True)
class SclsOptions:
    """The slice batcher's options: ``cost`` prices a slice (a :class:`SliceCost` or its mapping),
    ``slice_iterations`` is the slice length S, ``zeta`` (ζ) the share of the free KV a batch may
    take, ``max_batch`` caps the batch (None: the engine's limits)."""

    cost: SliceCost | Mapping[str, Any] | None = None
    slice_iterations: int = 128
    zeta: float = 0.9
    max_batch: int | None = None

    def __post_init__(self) -> None:
        positive_int("slice_iterations", self.slice_iterations)
        if not (isinstance(self.zeta, int | float) and 0 < self.zeta <= 1):
            raise ValueError(f"zeta must be in (0, 1], got {self.zeta!r}")
        positive_int("max_batch", self.max_batch, optional=True)


class SclsSliceBatcher:
    """SCLS adaptive batcher with ``options``: DP batches of one slice (S iterations) each; see the
    module docstring."""

    name = "scls"
    Options: ClassVar[type[SclsOptions]] = SclsOptions

    def __init__(self, options: SclsOptions | None = None) -> None:
        o = options if options is not None else SclsOptions()
        self.cost = as_scls_cost(o.cost)
        self.slice_iterations = o.slice_iterations
        self.zeta = float(o.zeta)
        self.max_batch = o.max_batch
        self._plan: list[tuple[str, ...]] = []
        self._plan_key: tuple[Any, ...] | None = None

    # ---------------------------------------------------------------------------------- estimators

    def estimate(self, requests: Sequence[SchedRequest]) -> float:
        """T_serve(N, L_i, S) of a batch: N rows padded to the longest prompt, one slice (Eq. 1–4)."""
        if not requests:
            return 0.0
        return float(
            self.cost.t_serve(len(requests), max(r.prompt_tokens for r in requests), self.slice_iterations)
        )

    def _fits(self, model: str, pool: PoolView, limits: BatchLimits) -> Callable[[int, int], bool]:
        budget = math.floor(self.zeta * pool.available_blocks)
        cap = min(limits.max_requests, self.max_batch or limits.max_requests)
        s = self.slice_iterations

        def fits(n: int, length: int) -> bool:
            return (
                n <= cap
                and n * length <= limits.max_prefill_tokens
                and n * pool.blocks_for(model, length + s) <= budget
            )

        return fits

    # ---------------------------------------------------------------------------------- batching

    def _candidates(
        self, waiting: Sequence[SchedRequest], pool: PoolView
    ) -> tuple[str, list[SchedRequest]] | None:
        avail = pool.available_blocks
        runnable = [r for r in sorted(waiting, key=arrival_key) if padded_blocks(pool, [r], 1) <= avail]
        if not runnable:
            return None
        model = runnable[0].model
        return model, [r for r in runnable if r.model == model]

    def plan(
        self, waiting: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits
    ) -> list[tuple[StaticBatch, float]]:
        """The full DP partition of the chosen model's waiting requests with each batch's T_serve estimate
        (the batch-level use: hand these to ``SclsMaxMin.assign_batches``). Pure: no cached state."""
        picked = self._candidates(waiting, pool)
        if picked is None:
            return []
        model, cands = picked
        return [
            (self._batch(model, members), self.estimate(members))
            for members in self._partition(model, cands, pool, limits)
        ]

    def _partition(
        self, model: str, cands: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits
    ) -> list[list[SchedRequest]]:
        s = self.slice_iterations
        cost = self.cost
        groups = dp_batches(
            [r.prompt_tokens for r in cands],
            lambda n, ln: cost.t_serve(n, ln, s),
            self._fits(model, pool, limits),
        )
        return [[cands[k] for k in g] for g in groups]

    def _batch(self, model: str, members: Sequence[SchedRequest]) -> StaticBatch:
        return StaticBatch(model, tuple(r.request_id for r in members), self.slice_iterations)

    @staticmethod
    def _key(
        model: str, reqs: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits
    ) -> tuple[Any, ...]:
        return (
            model,
            pool.available_blocks,
            limits,
            frozenset((r.request_id, r.prompt_tokens) for r in reqs),
        )

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        return None  # an arrival changes the waiting set, which invalidates the cached plan

    def form_batch(
        self, waiting: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits, now: float
    ) -> StaticBatch | None:
        picked = self._candidates(waiting, pool)
        if picked is None:
            self._plan, self._plan_key = [], None
            return None
        model, cands = picked
        key = self._key(model, cands, pool, limits)
        if key != self._plan_key or not self._plan:
            self._plan = [tuple(r.request_id for r in g) for g in self._partition(model, cands, pool, limits)]
        oldest = cands[0].request_id
        idx = next(i for i, ids in enumerate(self._plan) if oldest in ids)
        chosen = self._plan.pop(idx)
        by_id = {r.request_id: r for r in cands}
        rest = [by_id[rid] for ids in self._plan for rid in ids]
        self._plan_key = self._key(model, rest, pool, limits) if self._plan else None
        return StaticBatch(model, chosen, self.slice_iterations)

    def on_batch_done(
        self, batch: StaticBatch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None:
        mark_batch_ran(batch, duration_s, now, requests)


class SclsWorkerQueue:
    """The worker side of SCLS's central scheduling (§4.1 Fig. 6): the engine serves, in order, the batches
    the central scheduler offloaded to it (``push``), one static batch of one slice at a time; it forms
    none of its own. ``form_batch`` returns the head of the local queue once all its members are waiting
    (else None); ``on_batch_done`` pops nothing (the batch left the queue when formed) and tells
    ``on_done(batch, now)`` (the scheduler's hook: load −= the batch's estimate), if set."""

    name = "scls_worker"

    def __init__(self, on_done: Callable[[StaticBatch, float], None] | None = None) -> None:
        self.queue: deque[StaticBatch] = deque()
        self.on_done = on_done

    def push(self, batch: StaticBatch) -> None:
        self.queue.append(batch)

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        return None

    def form_batch(
        self, waiting: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits, now: float
    ) -> StaticBatch | None:
        if not self.queue:
            return None
        head = self.queue[0]
        ids = {r.request_id for r in waiting}
        if not all(rid in ids for rid in head.request_ids):
            return None
        return self.queue.popleft()

    def on_batch_done(
        self, batch: StaticBatch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None:
        check_duration(duration_s)
        if self.on_done is not None:
            self.on_done(batch, now)
