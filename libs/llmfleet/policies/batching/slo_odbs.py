"""UELLM's SLO and Output-Driven Dynamic Batch Scheduler (SLO-ODBS) and its SLO-DBS / ODBS variants
(He et al., "UELLM: A Unified and Efficient Approach for LLM Inference Serving", 2024, §4.2 Algorithm 1).

Stage 1 sorts the requests by SLO ascending. Stage 2 walks them keeping the current batch's maximum SLO
L_CM and maximum predicted output O_CM; with n requests in the batch, adding q costs

    T_l = (SLO_q + L_CM)·(n+1)·L1               (Eq. 1, per the listing line 9: no Σ)
    T_o = max(0, len_q − O_CM)·(n+1)·L2         (Eq. 2 / listing line 10, clamped)

and q joins when w1·T_l + w2·T_o ≤ threshold (Eq. 3, listing line 13) and the batch is still smaller
than its CM-based batch size (listing line 26, below), else the batch closes and q starts the next. The
first request of a batch always joins (listing line 13: batch_c = ∅).

Calibration of L1, L2 and the threshold (preset ``"paper"``, the default)
--------------------------------------------------------------------------
The test w1·T_l + w2·T_o ≤ Θ is homogeneous in (L1, L2, Θ): only Θ/L1 and Θ/L2 matter, so Θ keeps the
authors' 15,000 and L1, L2 are derived (:func:`calibrate`) from the paper's workload so that **at a
typical join the two terms contribute equally and together reach Θ**: the typical join is the boundary
between "similar" (cheaper: joins) and "dissimilar" (dearer: starts a new batch).

* SLO term. The paper's SLOs are "from 1 second to 350 seconds, completely random" (§5.1): reference
  s_ref = the midpoint 175.5 s. Walking in SLO order, a joining request's SLO_q ≈ L_CM, so
  SLO_q + L_CM ≈ 2·s_ref = 351 s at the reference.
* Length term. The predictor is trained on Alpaca (§4.1); on the 4,000-item Alpaca sample
  (``/work/shared/datasets/alpaca_4000.json``) outputs have mean 67.0, median 49, std 65.5, p90 147,
  max 642 tokens, and two random outputs differ by 67.3 tokens on average: reference padding jump
  Δ_ref = 67 tokens ("one typical output of padding per row").
* Position: k_ref = n+1 = 10, the authors' batch size (the size at which their 15,000 was set).

    L1 = Θ / (2 · 2·s_ref · k_ref) = 15000 / (2·351·10) = 2.1368 per second
    L2 = Θ / (2 · Δ_ref · k_ref)   = 15000 / (2·67·10)  = 11.194 per token

so a join at member k = n+1 passes iff k·[(SLO_q + L_CM)/702 s + Δ/134 tok] ≤ 10. Both terms bind on
the paper's ranges. SLO-DBS alone stops a batch of equal outputs at k ≤ 3510 s/SLO: 20 at the 175.5-s
midpoint, 10 at 350 s, 70 at 50 s (the CM size and the engine's limits bind below that). ODBS alone
refuses at the 10th member a request adding more than 134 tokens of padding (about one Alpaca output in
ten is longer than 147), at the 20th more than 67. SLO-ODBS trades them: at the 10th member a 67-token
jump joins at SLOs up to the midpoint and none at 350 s; at 50 s SLOs up to 115 tokens do.
With the authors' constants (L1 = 1/s, L2 = 1.2) the largest T_l at n+1 = 10 is (350+350)·10 = 7,000 <
15,000 and T_o needs a 1,250-token jump (Alpaca's longest output is 642): neither term ever binds and
SLO-ODBS degenerates to earliest-deadline batches of 10.

(The alternative of each term alone reaching Θ at the reference, i.e. twice these L1 and L2, halves the
batches of the loose half of the SLO range: on the UELLM benchmark it had 2.4× the mean latency of this
calibration at 16 req/s, 54.4 s against 23.1 s; see docs/benchmarks/papers.md, UELLM.)

CM-based batch size (listing lines 17/24/26)
--------------------------------------------
The listing keeps CM, the batch's maximum composite of output length and SLO, and "dynamically adjusts
batch_size according to the value of CM" without a formula. Ours (:meth:`SloOdbs.cm_batch_size`): the
batch size is the largest b that the batch's CM allows, where CM's two components are the batch's
longest predicted output O_CM (with its longest prompt s) and its tightest remaining SLO:

* memory (§2.3: a static batch's peak KV is 4·b·l·h·(s+n) bytes): b rows of s + O_CM tokens must fit
  the pool's free blocks above the watermark, b·blocks_for(s + ⌈O_CM⌉) ≤ available;
* latency, when a cost model is given: the batch's serve time T_serve(b, s, ⌈O_CM⌉) (b rows padded to s,
  ⌈O_CM⌉ iterations) must stay within the tightest remaining SLO of the batch. If even one row misses
  that SLO, the latency bound is dropped (a smaller batch cannot save that request and only costs
  throughput);
* and the caps: ``max_batch`` (None = none) and the engine's ``BatchLimits.max_requests``.

A longer output or a larger prompt (CM grows) shrinks b; a looser SLO allows more rows. The cost model is
declared by type: anything with ``t_serve(n, l_in, s) -> seconds`` (:class:`BatchCost`, the same form as
SCLS's :class:`~llmfleet.policies.batching.scls_dp.SliceCost`), a profile record's ``scls`` mapping
``{"prefill": {...}, "decode": {...}}``, or ``{"model": NAME, "hardware": NAME, "tp": 1, "source": S}``
for catalog entries priced by cost source S (default: the default cost source,
``llmfleet.costmodel.sources``), fitted to the SCLS form (JSON-friendly for ``--policy-options``). ``cost=None`` (default): memory
and caps only.

Presets (option ``preset``)
---------------------------
* ``"paper"`` (default): the calibrated L1, L2 above, Θ = 15000, w1 = w2 = 1, no fixed batch cap (the CM
  size and the engine's limits bound the batch), sort by SLO (listing line 4).
* ``"authors"``: the constants of the authors' public scripts: Θ = 15000, batch 10, the 1.2 length factor
  (L2), sort key SLO + 0.5·output (seconds + 0.5·tokens, as they wrote it); their scripts have no SLO
  term, so L1 = 1/s is ours (it never binds, see above).

Any explicit option overrides the preset's value: ``slo_weight`` (w1), ``length_weight`` (w2),
``slo_scale`` (L1), ``length_scale`` (L2), ``threshold`` (Θ), ``max_batch``, ``sort_output_weight``,
``default_slo_s``.

Resolved ambiguities:

* Eq. 2 has "+O_CM", the listing "−O_CM": we use the padding increment clamped at 0 (a shorter output
  adds no length cost), as the notes suggest. The authors' code applies the unclamped difference with
  O_CM seeded from the first request, which is the same test whenever len_q ≤ O_CM.
* Variants: SLO-DBS keeps only the SLO term (w2 = 0), ODBS only the length term (w1 = 0). The paper's
  sentence says the opposite ("when w1 = 0, ... SLO-DBS"), but w1 weights T_l, the SLO term, so the
  names only make sense this way round. All three sort alike (the variants are weight settings).
* SLO = remaining time to the request's deadline, ``deadline_s − now`` in **seconds** (clamped at 0);
  without a deadline, ``arrival_s + default_slo_s − now``. In the paper's offline runs everything arrives
  at 0, so remaining time = the SLO. Sorting by it is earliest-deadline-first. ``default_slo_s`` = 350 s,
  the paper's loosest SLO: requests without a deadline go after every deadline in the paper's range.
* len_q = ``predicted_output_tokens`` (the profiler's prediction), capped by ``max_new_tokens``; when
  there is no prediction, ``max_new_tokens`` (the worst case, as an unprofiled system must assume).
* Memory: besides the CM size, a request that would break ``BatchLimits.max_prefill_tokens`` (the padded
  prefill n·s) closes the batch. The first request of a batch only needs its padded admission
  (``padded_blocks(pool, [r], 1)``); one that cannot even be admitted is left out (it is stuck, see
  ``stuck_requests``). The batch runs to its longest output (``max_iterations`` None): if the prediction
  was short and the pool cannot grow, the engine ends it early (an OOM slice end).
* One model, one batch per call: the walk runs over the requests of the model of the first runnable
  request in sort order, and ``form_batch`` returns the first batch (it holds the tightest SLOs); the
  rest is recomputed next call. :meth:`SloOdbs.partition` returns the whole list (stage 3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from llmfleet.costmodel.hardware import hardware
from llmfleet.costmodel.latency_model import cost_record
from llmfleet.costmodel.models import model_arch
from llmfleet.costmodel.scls import SclsModel
from llmfleet.costmodel.sources import DEFAULT_COST_SOURCE, check_cost_source
from llmfleet.policies.batching.base import StaticBatch, mark_batch_ran, padded_blocks, padded_tokens
from llmfleet.policies.batching.scls_dp import as_scls_cost
from llmfleet.policies.checks import positive_int
from llmfleet.policies.request.base import (
    BatchLimits,
    PoolView,
    SchedRequest,
)

MODES = ("slo_odbs", "slo_dbs", "odbs")

# The paper's workload, the references of the calibration (see the module docstring).
PAPER_SLO_RANGE_S = (1.0, 350.0)  # §5.1: SLOs "from 1 second to 350 seconds, completely random"
ALPACA_OUTPUT_SPREAD_TOKENS = 67.0  # mean |o_a − o_b| of two Alpaca outputs (67.3; mean output 67.0)
REFERENCE_BATCH = 10  # n+1 at the authors' batch size
AUTHORS_THRESHOLD = 15000.0


@runtime_checkable
class BatchCost(Protocol):
    """The cost model SLO-ODBS's CM sizing needs: T_serve(n, l_in, s) in seconds, the time of a static
    batch of n rows padded to the prompt l_in running s iterations (SCLS's Eq. 1–4 form)."""

    def t_serve(self, n: int, l_in: int, s: int) -> float: ...


def calibrate(
    slo_range_s: tuple[float, float] = PAPER_SLO_RANGE_S,
    spread_tokens: float = ALPACA_OUTPUT_SPREAD_TOKENS,
    reference_batch: int = REFERENCE_BATCH,
    threshold: float = AUTHORS_THRESHOLD,
) -> tuple[float, float]:
    """(L1, L2) such that at the n+1 = ``reference_batch``-th member each term contributes ``threshold``/2:
    T_l with SLO_q + L_CM = 2·midpoint of ``slo_range_s``, T_o with a padding jump of ``spread_tokens``."""
    lo, hi = slo_range_s
    if not (0 <= lo < hi and math.isfinite(hi)) or not spread_tokens > 0 or reference_batch < 1:
        raise ValueError(f"bad calibration inputs: {slo_range_s}, {spread_tokens}, {reference_batch}")
    s_ref = (lo + hi) / 2
    half = threshold / 2
    return half / (2 * s_ref * reference_batch), half / (spread_tokens * reference_batch)


@dataclass(frozen=True)
class Preset:
    """The constants of Eq. 1–3: ``slo_scale`` is L1 (per second of SLO), ``length_scale`` L2 (per
    token of padding), ``slo_weight`` w1 and ``length_weight`` w2 (the weights of T_l and T_o), and
    ``threshold`` Θ."""

    slo_scale: float
    length_scale: float
    threshold: float
    max_batch: int | None
    sort_output_weight: float  # sort key: SLO + this · predicted output
    slo_weight: float = 1.0
    length_weight: float = 1.0
    default_slo_s: float = PAPER_SLO_RANGE_S[1]


_SLO_SCALE, _LENGTH_SCALE = calibrate()
PRESETS: dict[str, Preset] = {
    "paper": Preset(
        slo_scale=_SLO_SCALE,
        length_scale=_LENGTH_SCALE,
        threshold=AUTHORS_THRESHOLD,
        max_batch=None,
        sort_output_weight=0.0,
    ),
    "authors": Preset(
        slo_scale=1.0, length_scale=1.2, threshold=AUTHORS_THRESHOLD, max_batch=10, sort_output_weight=0.5
    ),
}


@lru_cache(maxsize=16)
def _catalog_cost(model: str, hw: str, tp: int, source: str) -> BatchCost:
    rec = cost_record(model_arch(model), hardware(hw), tp, source, date="1970-01-01T00:00:00")
    return SclsModel(rec.scls.prefill, rec.scls.decode)


def as_batch_cost(cost: BatchCost | Mapping[str, Any] | None) -> BatchCost | None:
    """None → None (no latency bound); ``{"model", "hardware"[, "tp"][, "source"]}`` → that cost
    source's SCLS form for the catalog entries; ``{"prefill", "decode"}`` → :class:`~llmfleet.costmodel.scls.SclsModel`; an object with
    ``t_serve`` as is."""
    if cost is None:
        return None
    if isinstance(cost, Mapping):
        if "model" in cost:
            extra = set(cost) - {"model", "hardware", "tp", "source"}
            if extra or "hardware" not in cost:
                raise ValueError(f"cost needs model and hardware (and tp, source), got keys {sorted(cost)}")
            tp = positive_int("cost tp", cost.get("tp", 1))
            source = check_cost_source(str(cost.get("source", DEFAULT_COST_SOURCE)))
            return _catalog_cost(str(cost["model"]), str(cost["hardware"]), tp, source)
        return as_scls_cost(cost)
    if not callable(getattr(cost, "t_serve", None)):
        raise ValueError(f"cost must have t_serve(n, l_in, s), got {type(cost).__name__}")
    return cost


def _positive(name: str, v: object, allow_zero: bool = True) -> float:
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or not math.isfinite(v)
        or v < 0
        or (v == 0 and not allow_zero)
    ):
        raise ValueError(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class SloOdbsOptions:
    """SLO-ODBS's options: ``preset`` picks the constants; an option left unset (None, ``max_batch``
    ``"preset"``) takes the preset's value (see the module docstring for each)."""

    preset: str = "paper"
    slo_weight: float | None = None
    length_weight: float | None = None
    slo_scale: float | None = None
    length_scale: float | None = None
    threshold: float | None = None
    max_batch: int | Literal["preset"] | None = "preset"
    default_slo_s: float | None = None
    sort_output_weight: float | None = None
    cost: BatchCost | Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {self.preset!r}")
        for name in ("slo_weight", "length_weight", "slo_scale", "length_scale", "threshold"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        for name in ("default_slo_s", "sort_output_weight"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.max_batch != "preset":
            positive_int("max_batch", self.max_batch, optional=True)


class SloOdbs:
    """SLO-ODBS static batcher (``mode`` picks SLO-ODBS, SLO-DBS or ODBS; ``preset`` the constants); see
    the module docstring."""

    name = "slo_odbs"
    Options: ClassVar[type[SloOdbsOptions]] = SloOdbsOptions

    def __init__(self, options: SloOdbsOptions | None = None, *, mode: str = "slo_odbs") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        o = options if options is not None else SloOdbsOptions()
        base = PRESETS[o.preset]

        def pick(v: float | None, default: float) -> float:
            return default if v is None else float(v)

        self.mode = mode
        self.name = mode
        self.preset = o.preset
        self.slo_weight = 0.0 if mode == "odbs" else pick(o.slo_weight, base.slo_weight)
        self.length_weight = 0.0 if mode == "slo_dbs" else pick(o.length_weight, base.length_weight)
        self.slo_scale = pick(o.slo_scale, base.slo_scale)
        self.length_scale = pick(o.length_scale, base.length_scale)
        self.threshold = pick(o.threshold, base.threshold)
        self.max_batch: int | None = base.max_batch if o.max_batch == "preset" else o.max_batch
        self.default_slo_s = pick(o.default_slo_s, base.default_slo_s)
        self.sort_output_weight = pick(o.sort_output_weight, base.sort_output_weight)
        self.cost = as_batch_cost(o.cost)

    # ------------------------------------------------------------------------------ per request

    def slo(self, req: SchedRequest, now: float) -> float:
        """Remaining SLO in seconds: deadline − now (deadline = arrival + default_slo_s when unset), ≥ 0."""
        deadline = req.deadline_s if req.deadline_s is not None else req.arrival_s + self.default_slo_s
        return max(0.0, deadline - now)

    @staticmethod
    def length(req: SchedRequest) -> float:
        """Predicted output tokens capped by ``max_new_tokens``; ``max_new_tokens`` without a prediction."""
        pred = req.predicted_output_tokens
        if pred is None or not math.isfinite(pred):
            return float(req.max_new_tokens)
        return float(min(max(pred, 0.0), req.max_new_tokens))

    def sort_key(self, req: SchedRequest, now: float) -> tuple[float, float, str]:
        """Stage 1's order: SLO ascending (the listing), or SLO + w·output with the authors' w = 0.5."""
        key = self.slo(req, now) + self.sort_output_weight * self.length(req)
        return (key, req.arrival_s, req.request_id)

    def join_cost(self, slo_q: float, len_q: float, l_cm: float, o_cm: float, n: int) -> float:
        """w1·T_l + w2·T_o for adding a request to a batch of n (Eq. 1–3, the increment clamped)."""
        return self.slo_weight * self.slo_term(slo_q, l_cm, n) + self.length_weight * self.length_term(
            len_q, o_cm, n
        )

    def slo_term(self, slo_q: float, l_cm: float, n: int) -> float:
        """T_l = (SLO_q + L_CM)·(n+1)·L1 (Eq. 1, listing line 9)."""
        return (slo_q + l_cm) * (n + 1) * self.slo_scale

    def length_term(self, len_q: float, o_cm: float, n: int) -> float:
        """T_o = max(0, len_q − O_CM)·(n+1)·L2 (Eq. 2, listing line 10, clamped)."""
        return max(0.0, len_q - o_cm) * (n + 1) * self.length_scale

    def cm_batch_size(
        self,
        model: str,
        longest_prompt: int,
        o_cm: float,
        slo_budget_s: float,
        pool: PoolView,
        limits: BatchLimits,
    ) -> int:
        """The CM-based batch size (listing line 26): the largest b ≥ 1 within the caps whose padded KV
        b·blocks_for(s + ⌈O_CM⌉) fits the available blocks and, with a cost model, whose serve time
        T_serve(b, s, ⌈O_CM⌉) meets ``slo_budget_s`` (dropped when even b = 1 misses it)."""
        cap = limits.max_requests if self.max_batch is None else min(self.max_batch, limits.max_requests)
        iters = max(1, math.ceil(o_cm))
        row = pool.blocks_for(model, longest_prompt + iters)  # ≥ 1: s + ⌈O_CM⌉ ≥ 1 token
        b = max(1, min(cap, pool.available_blocks // row))
        cost = self.cost
        if cost is None or b <= 1 or cost.t_serve(1, longest_prompt, iters) > slo_budget_s:
            return b
        if cost.t_serve(b, longest_prompt, iters) <= slo_budget_s:
            return b
        lo, hi = 1, b  # t_serve(lo) meets the budget, t_serve(hi) does not (monotone in n)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if cost.t_serve(mid, longest_prompt, iters) <= slo_budget_s:
                lo = mid
            else:
                hi = mid
        return lo

    # ------------------------------------------------------------------------------ batching

    def partition(
        self, waiting: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits, now: float
    ) -> list[StaticBatch]:
        """Stages 1–3 over the chosen model's runnable requests: every batch, in sort order."""
        avail = pool.available_blocks
        order = sorted(waiting, key=lambda r: self.sort_key(r, now))
        runnable = [r for r in order if padded_blocks(pool, [r], 1) <= avail]
        if not runnable:
            return []
        model = runnable[0].model
        batches: list[list[SchedRequest]] = []
        cur: list[SchedRequest] = []
        l_cm = o_cm = slo_min = 0.0
        longest = 0
        for q in (r for r in runnable if r.model == model):
            slo_q, len_q = self.slo(q, now), self.length(q)
            if cur:
                trial = [*cur, q]
                new_o, new_s = max(o_cm, len_q), max(longest, q.prompt_tokens)
                new_min = min(slo_min, slo_q)
                ok = (
                    self.join_cost(slo_q, len_q, l_cm, o_cm, len(cur)) <= self.threshold
                    and len(trial) <= self.cm_batch_size(model, new_s, new_o, new_min, pool, limits)
                    and padded_tokens(trial, 0) <= limits.max_prefill_tokens
                )
                if ok:
                    cur.append(q)
                    l_cm, o_cm, slo_min, longest = max(l_cm, slo_q), new_o, new_min, new_s
                    continue
                batches.append(cur)
            cur, l_cm, o_cm, slo_min, longest = [q], slo_q, len_q, slo_q, q.prompt_tokens
        if cur:
            batches.append(cur)
        return [StaticBatch(model, tuple(r.request_id for r in b)) for b in batches]

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        return None

    def form_batch(
        self, waiting: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits, now: float
    ) -> StaticBatch | None:
        batches = self.partition(waiting, pool, limits, now)
        return batches[0] if batches else None

    def on_batch_done(
        self, batch: StaticBatch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None:
        mark_batch_ran(batch, duration_s, now, requests)


class SloDbs(SloOdbs):
    """SLO-DBS: SLO-ODBS with the SLO term only (w2 = 0)."""

    def __init__(self, options: SloOdbsOptions | None = None) -> None:
        super().__init__(options, mode="slo_dbs")


class Odbs(SloOdbs):
    """ODBS: SLO-ODBS with the output-length term only (w1 = 0)."""

    def __init__(self, options: SloOdbsOptions | None = None) -> None:
        super().__init__(options, mode="odbs")
