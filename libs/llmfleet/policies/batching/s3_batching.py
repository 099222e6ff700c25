"""S³-style static batching (Jin et al., "S³: Increasing GPU Utilization during Generative Inference
for Higher Throughput", 2023), UELLM's batching baseline.

S³'s idea: reserve KV for each request's *predicted* output instead of the maximum generation length, so
that more requests fit in a batch. Here, FCFS (arrival order, ties by id):

* Seed: the oldest waiting request whose padded admission ``padded_blocks(pool, [r], 1)`` fits; the
  batch's model is its model (older requests that cannot be admitted even alone are passed over).
* Then the following requests of that model while the batch's reservation fits ``pool.available_blocks``
  and the batch stays within ``limits.max_requests`` requests and its padded prefill
  ``n · longest prompt`` within ``limits.max_prefill_tokens``; it stops at the first that does not fit
  (no later request jumps ahead).

Resolved ambiguities:

* The reservation of a *static* batch is padded (every row is the longest prompt plus the longest
  output: that is what the engine allocates), so "prompt + predicted output per request" becomes
  ``padded_blocks(pool, members, max predicted output)``. Predicted output = ``predicted_output_tokens``
  capped by ``max_new_tokens``; without a prediction, ``max_new_tokens`` (S³ then degrades to the
  max-length reservation it improves on).
* Misprediction: S³ preempts a request that outgrows its reservation; here the batch runs to its longest
  output (``max_iterations`` None) and the engine ends it early when the pool cannot grow (an OOM slice
  end); unfinished requests return to ``waiting`` and are batched again.
* No length bucketing of the batch: the authors' UELLM baseline code sorts by predicted length; we keep
  FCFS so that the baseline isolates the memory reservation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llmfleet.policies.batching.base import (
    StaticBatch,
    first_fitting,
    mark_batch_ran,
    padded_blocks,
    padded_tokens,
)
from llmfleet.policies.request.base import (
    BatchLimits,
    PoolView,
    SchedRequest,
    arrival_key,
)


def predicted_output(req: SchedRequest) -> int:
    """Tokens S³ reserves for the output: ⌈prediction⌉ capped by ``max_new_tokens`` (the cap if none)."""
    pred = req.predicted_output_tokens
    if pred is None or not math.isfinite(pred):
        return req.max_new_tokens
    return min(req.max_new_tokens, max(0, math.ceil(pred)))


class S3Batching:
    """FCFS static batches sized by predicted-length KV reservation (S³); see the module docstring."""

    name = "s3"

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        return None

    def form_batch(
        self, waiting: Sequence[SchedRequest], pool: PoolView, limits: BatchLimits, now: float
    ) -> StaticBatch | None:
        waits = sorted(waiting, key=arrival_key)
        avail = pool.available_blocks
        start = first_fitting(waits, pool)
        if start is None:
            return None
        members = [waits[start]]
        out_max = predicted_output(waits[start])
        cap = limits.max_requests
        for r in waits[start + 1 :]:
            if len(members) >= cap:
                break
            if r.model != members[0].model:
                continue
            trial = [*members, r]
            trial_out = max(out_max, predicted_output(r))
            if (
                padded_blocks(pool, trial, max(1, trial_out)) > avail
                or padded_tokens(trial, 0) > limits.max_prefill_tokens
            ):
                break
            members, out_max = trial, trial_out
        return StaticBatch(members[0].model, tuple(r.request_id for r in members))

    def on_batch_done(
        self, batch: StaticBatch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None:
        mark_batch_ran(batch, duration_s, now, requests)
