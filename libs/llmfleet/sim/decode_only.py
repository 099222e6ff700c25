"""Decode-only instances of split-phase serving (Splitwise, DistServe; Aladdin §5.1, Fig. 5).

A split-phase cluster runs each prompt on a prefill worker, which samples the first token, and hands
the request with its KV to a decode worker. On an instance with ``engine.decode_only`` the simulator
models the decode worker: an arriving request is the hand-over, so it lands in the engine core as a
migrated request does (:meth:`~llmfleet.engine_core.EngineCore.land`) with the KV of its prompt
(context − 1 = prompt tokens, the first token sampled but not yet in the cache) and joins the running
set as a decode: its first step here is a decode step, and no prefill is priced for it. Its first
token counts at its arrival, so its TTFT is 0 here (the prefill worker's concern) and its ATGT runs
from its arrival at the decode worker.

When its KV does not fit, ``land`` sends it back to waiting to re-prefill prompt + first token here
(as a migrated request whose KV does not fit; a decode engine recomputes a preempted request the same
way). A request of one output token has no decode phase (the prefill worker finished it): callers
leave it out; landed here it would take one decode step.

``SimInstance`` lands such a request at once between steps, else at the next step boundary, where the
free KV is exact (its ``landing`` list, joined by the fleet's kick as a moved request is).
"""

from __future__ import annotations

from llmfleet.engine_core import CoreRequest
from llmfleet.sim.records import RequestRecord


def prefilled(r: CoreRequest, rec: RequestRecord, now: float) -> None:
    """Mark ``r`` (new, in no core) as handed over at ``now`` by a prefill worker: its first token was
    sampled there (``generated`` 1, so ``kv_tokens`` = its prompt) and counts at ``now``."""
    r.sched.generated = 1
    r.sched.phase = "decode"
    rec.produced = max(rec.produced, 1)
    if rec.first_token_s is None:
        rec.first_token_s = now
