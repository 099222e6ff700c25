"""MuxServe-style round-robin scheduling over the services and models sharing one engine.

After MuxServe's adaptive batch scheduling (Duan et al., "MuxServe: Flexible Spatial-Temporal
Multiplexing for Multiple LLM Serving", ICML 2024, "ADBS"): prefills have priority, and the LLMs take
turns round-robin so none is starved. This engine runs one batch at a time (no spatial SM split), so the
multiplexing is temporal only. Batches are single-phase and single-model:

* Prefill turn: services take turns in round-robin order (service names sorted, starting after the
  service of the last prefill batch that ran). The turn goes to the next service with waiting
  requests; its batch is its waiting requests of ONE model (the model of its oldest waiting request),
  in FCFS order (arrival, then id), admitted with :func:`admit_prefills` (slots ``max_requests``,
  prefill-token limit, pool; stops at the first that does not fit).
* Turn holding: if that service's oldest request of the model does not fit the pool and something is
  running, no other service may prefill in its place (that would let one service's small requests
  starve another's large one); a decode runs instead and frees KV. With nothing running, waiting cannot
  help, so the turn passes to the next service in order (:func:`stuck_requests` names the ones that can
  never fit).
* Decode turn: models with running requests take turns round-robin (model names sorted, starting after
  the model of the last decode batch); the batch is that model's running requests, oldest first, up to
  ``max_requests``.
* Phase rule: prefill priority, but never two prefill batches in a row while requests are running.
  Exactly: if the last batch that ran was a prefill and something is running, decode; otherwise prefill
  if the turn's service has an admissible prefill (see turn holding); otherwise decode if anything is
  running; otherwise ``None``.

Round-robin cursors advance in ``on_iteration`` (only batches that ran count), so calling
``next_batch`` twice without running gives the same batch. Victim: the latest arrival (ties by the larger
request id), as vLLM.

MuxServe also gives each LLM its own KV quota. Here all models share the pool the engine passes in; a
per-model KV split is configured in the simulator/engine (one pool per model), not in this policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.policies.request.base import (
    Batch,
    BatchLimits,
    BatchPhase,
    PoolView,
    SchedRequest,
    admit_prefills,
    arrival_key,
    batch_members,
    check_duration,
    mark_ran,
)


class MuxServeRR:
    """Round-robin prefills across services, round-robin decodes across models, alternating."""

    name = "muxserve_rr"

    def __init__(self) -> None:
        self.last_service: str | None = None  # service of the last prefill batch that ran
        self.last_model: str | None = None  # model of the last decode batch that ran
        self.last_phase: BatchPhase | None = None

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        return None

    def next_batch(
        self,
        waiting: Sequence[SchedRequest],
        running: Sequence[SchedRequest],
        pool: PoolView,
        limits: BatchLimits,
        now: float,
    ) -> Batch | None:
        if not waiting and not running:
            return None
        if self.last_phase == "prefill" and running:
            return self._decode(running, limits)
        batch = self._prefill(waiting, bool(running), pool, limits)
        if batch is None and running:
            batch = self._decode(running, limits)
        return batch

    def on_iteration(
        self, batch: Batch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None:
        check_duration(duration_s)
        members = batch_members(batch, requests)
        for r in members:
            mark_ran(r, duration_s, now)
        if batch.phase == "prefill" and members:
            self.last_service = min(members, key=arrival_key).service
        elif batch.phase == "decode":
            self.last_model = batch.model
        self.last_phase = batch.phase

    def on_finish(self, req: SchedRequest, now: float) -> None:
        return None

    def preemption_victim(self, running: Sequence[SchedRequest], now: float) -> SchedRequest:
        if not running:
            raise ValueError("no running request to preempt")
        return max(running, key=arrival_key)

    # ------------------------------------------------------------------ internals

    def _prefill(
        self, waiting: Sequence[SchedRequest], anything_running: bool, pool: PoolView, limits: BatchLimits
    ) -> Batch | None:
        waits = sorted(waiting, key=arrival_key)
        for service in _rotate({r.service for r in waits}, self.last_service):
            mine = [r for r in waits if r.service == service]
            model = mine[0].model
            chosen = admit_prefills((r for r in mine if r.model == model), pool, limits, limits.max_requests)
            if chosen:
                return Batch(model, "prefill", tuple(r.request_id for r in chosen))
            if anything_running:
                return None  # the turn's service holds its turn until decodes free KV
        return None

    def _decode(self, running: Sequence[SchedRequest], limits: BatchLimits) -> Batch:
        runs = sorted(running, key=arrival_key)
        model = _rotate({r.model for r in runs}, self.last_model)[0]
        members = [r for r in runs if r.model == model][: limits.max_requests]
        return Batch(model, "decode", tuple(r.request_id for r in members))


def _rotate(names: set[str], last: str | None) -> list[str]:
    """``names`` sorted, starting after ``last`` (which need not be among them) and wrapping around."""
    order = sorted(names)
    if last is None:
        return order
    return [n for n in order if n > last] + [n for n in order if n <= last]
