"""UELLM's SLO and Output-Driven Dynamic Batch Scheduler (SLO-ODBS) and its SLO-DBS / ODBS variants
(He et al., "UELLM: A Unified and Efficient Approach for LLM Inference Serving", 2024, §4.2 Algorithm 1).

Stage 1 sorts the requests by SLO ascending. Stage 2 walks them keeping the current batch's maximum SLO
L_CM and maximum predicted output O_CM; with n requests in the batch, adding q costs

    T_l = (SLO_q + L_CM)·(n+1)·L1               (Eq. 1, per the listing: no Σ)
    T_o = max(0, len_q − O_CM)·(n+1)·L2         (Eq. 2 / listing line 10, clamped)

and q joins when w1·T_l + w2·T_o ≤ threshold (Eq. 3), else the batch closes and q starts the next. The
first request of a batch always joins (listing line 13: batch_c = ∅).

Resolved ambiguities:

* Eq. 2 has "+O_CM", the listing "−O_CM": we use the padding increment clamped at 0 (a shorter output
  adds no length cost), as the notes suggest. The authors' code applies the unclamped difference with
  O_CM seeded from the first request, which is the same test whenever len_q ≤ O_CM.
* Variants: SLO-DBS keeps only the SLO term (w2 = 0), ODBS only the length term (w1 = 0). The paper's
  sentence says the opposite ("when w1 = 0, ... SLO-DBS"), but w1 weights T_l, the SLO term, so the
  names only make sense this way round. All three sort by SLO (the variants are weight settings).
* SLO = remaining time to the request's deadline, ``deadline_s − now`` in **seconds** (clamped at 0);
  without a deadline, ``arrival_s + default_slo_s − now``. The paper's SLOs are 1–350 s and the
  authors' code compares them with wall seconds; in the paper's offline runs everything arrives at 0,
  so remaining time = the SLO. Sorting by it is earliest-deadline-first. ``default_slo_s`` = 350 s, the
  paper's loosest SLO: requests without a deadline go after every deadline in the paper's range.
* len_q = ``predicted_output_tokens`` (the profiler's prediction), capped by ``max_new_tokens``; when
  there is no prediction, ``max_new_tokens`` (the worst case, as an unprofiled system must assume).
* Defaults: threshold 15000, L2 = 1.2 and a batch cap of 10 from the authors' code (its "dynamic
  batch_size from CM" is 10 in every branch, so CM is not kept). The authors' code has no SLO term, so
  L1 is ours: L1 = 1 per second makes an SLO-second cost as much as ~0.8 padded output tokens (L2 = 1.2
  per token), so both terms matter at the paper's scales (SLOs up to 350 s, outputs up to ~1000
  tokens); w1 = w2 = 1. With these, 10 requests of 350 s SLO cost 7000 and leave room for a 666-token
  padding jump; ODBS alone splits a 10-batch only at a jump of > 1250 tokens.
* Memory: the paper's KV of a static batch is 4·b·l·h·(s+n) bytes — b rows padded to the longest input s
  plus the longest output n, i.e. ``padded_blocks(pool, members, ⌈O_CM⌉)`` here, which must fit
  ``pool.available_blocks``; a request that would break that (or ``BatchLimits``: the request count, the
  padded prefill ``n·s ≤ max_prefill_tokens``) also closes the batch. The first request of a batch only
  needs its padded admission (``padded_blocks(pool, [r], 1)``); one that cannot even be admitted is left
  out (it is stuck, see ``stuck_requests``). The batch runs to its longest output (``max_iterations``
  None): if the prediction was short and the pool cannot grow, the engine ends it early (an OOM slice end).
* One model, one batch per call: the walk runs over the requests of the model of the earliest-SLO
  runnable request, and ``form_batch`` returns the first batch (it holds the tightest SLOs); the rest is
  recomputed next call (O(n log n)). :meth:`SloOdbs.partition` returns the whole list (stage 3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llmfleet.policies.batching.base import StaticBatch, padded_blocks, padded_tokens
from llmfleet.policies.checks import positive_int
from llmfleet.policies.request.base import (
    BatchLimits,
    PoolView,
    SchedRequest,
    check_duration,
    mark_ran,
)

MODES = ("slo_odbs", "slo_dbs", "odbs")


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


class SloOdbs:
    """SLO-ODBS static batcher (``mode`` picks SLO-ODBS, SLO-DBS or ODBS); see the module docstring."""

    name = "slo_odbs"

    def __init__(
        self,
        mode: str = "slo_odbs",
        w1: float = 1.0,
        w2: float = 1.0,
        L1: float = 1.0,  # the paper's symbols L1, L2
        L2: float = 1.2,
        threshold: float = 15000.0,
        max_batch: int = 10,
        default_slo_s: float = 350.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        positive_int("max_batch", max_batch)
        self.mode = mode
        self.name = mode
        self.w1 = 0.0 if mode == "odbs" else _positive("w1", w1)
        self.w2 = 0.0 if mode == "slo_dbs" else _positive("w2", w2)
        self.L1 = _positive("L1", L1)
        self.L2 = _positive("L2", L2)
        self.threshold = _positive("threshold", threshold)
        self.max_batch = max_batch
        self.default_slo_s = _positive("default_slo_s", default_slo_s)

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

    def join_cost(self, slo_q: float, len_q: float, l_cm: float, o_cm: float, n: int) -> float:
        """w1·T_l + w2·T_o for adding a request to a batch of n (Eq. 1–3, the increment clamped)."""
        t_l = (slo_q + l_cm) * (n + 1) * self.L1
        t_o = max(0.0, len_q - o_cm) * (n + 1) * self.L2
        return self.w1 * t_l + self.w2 * t_o

    # ------------------------------------------------------------------------------ batching

    def partition(
        self, waiting: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits, now: float
    ) -> list[StaticBatch]:
        """Stages 1–3 over the chosen model's runnable requests: every batch, tightest SLOs first."""
        avail = pool.available_blocks
        order = sorted(waiting, key=lambda r: (self.slo(r, now), r.arrival_s, r.request_id))
        runnable = [r for r in order if padded_blocks(pool, [r], 1) <= avail]
        if not runnable:
            return []
        model = runnable[0].model
        cap = min(self.max_batch, limits.max_requests)
        batches: list[list[SchedRequest]] = []
        cur: list[SchedRequest] = []
        l_cm = o_cm = 0.0
        for q in (r for r in runnable if r.model == model):
            slo_q, len_q = self.slo(q, now), self.length(q)
            if cur:
                trial = [*cur, q]
                new_o = max(o_cm, len_q)
                ok = (
                    len(cur) < cap
                    and self.join_cost(slo_q, len_q, l_cm, o_cm, len(cur)) <= self.threshold
                    and padded_blocks(pool, trial, max(1, math.ceil(new_o))) <= avail
                    and padded_tokens(trial, 0) <= limits.max_prefill_tokens
                )
                if ok:
                    cur.append(q)
                    l_cm, o_cm = max(l_cm, slo_q), new_o
                    continue
                batches.append(cur)
            cur, l_cm, o_cm = [q], slo_q, len_q
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
        check_duration(duration_s)
        ids = set(batch.request_ids)
        for r in requests:
            if r.request_id in ids:
                mark_ran(r, duration_s, now)


class SloDbs(SloOdbs):
    """SLO-DBS: SLO-ODBS with the SLO term only (w2 = 0)."""

    def __init__(self, **kwargs: object) -> None:
        if kwargs.pop("mode", "slo_dbs") != "slo_dbs":
            raise ValueError("SloDbs is mode 'slo_dbs'")
        super().__init__(mode="slo_dbs", **kwargs)  # type: ignore[arg-type]


class Odbs(SloOdbs):
    """ODBS: SLO-ODBS with the output-length term only (w1 = 0)."""

    def __init__(self, **kwargs: object) -> None:
        if kwargs.pop("mode", "odbs") != "odbs":
            raise ValueError("Odbs is mode 'odbs'")
        super().__init__(mode="odbs", **kwargs)  # type: ignore[arg-type]
