"""SCLS central scheduling in the scheduler, for services with ``dispatch: scls_central``: the live driver
of the pure policy :class:`~llmfleet.policies.central.scls_central.SclsCentralPolicy` (the algorithm is
documented there; the simulator's driver is ``llmfleet.sim.scls_central``).

The driver keeps the clock and the requests' side. Every interval T (Eq. 12) it asks the policy for a plan
of the pool and resolves each offloaded member's waiting slot with its :class:`Assignment`. The relay
(``relay._central_slices``) then runs one slice per assignment: the request tagged with the batch
(``batch_id``, ``batch_size``; the engine's ``given`` batching policy runs the batch as one static batch)
and ``max_tokens`` capped at S more tokens (:meth:`SclsCentral.slice_request`). A member back from its
slice counts towards its batch's end (:meth:`SclsCentral.returned`: the engine's load drops by the batch's
estimate once every member is back); one that ended its slice unfinished (:meth:`SclsCentral.unfinished`)
comes back to the pool with its tokens so far.

Departures from the paper, each for a stated reason:

* slice end is ``recompute``: each slice is its own Generate call and the engine frees the request's KV
  when it returns, so the next slice re-prefills prompt + tokens wherever it lands;
* the scheduler holds no tokenizer: a request's input length is its prompt estimated at 4 bytes a token
  (``approx_token_count``) until an engine reports the real count, plus its tokens so far;
* the DP's memory bound is one engine's KV capacity (the smallest among the engines hosting the model), in
  tokens, from the engines' registered ``kv_capacity_bytes`` and reported bytes per token; without a
  report yet, the bound is the batch-size cap alone; a request larger than an engine's pool alone still
  runs alone (``oversized="alone"``: the engine preempts or refuses it);
* the DP has no prefill-token cap (the paper bounds memory only).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmfleet.api.v1 import common_pb2, engine_pb2
from llmfleet.policies.central.scls_central import (
    MODE,
    CentralBatch,
    PoolEntry,
    SclsCentralOptions,
    SclsCentralPolicy,
    WorkerView,
)
from llmfleet.policies.checks import positive_int

log = logging.getLogger(__name__)

__all__ = ["MODE", "Assignment", "EngineView", "Member", "SclsCentral"]

SLICE_ENDS = (common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_MIGRATED)


@dataclass(frozen=True)
class Assignment:
    engine_id: str
    batch_id: str
    batch_size: int
    batch: CentralBatch | None = field(default=None, compare=False, repr=False)  # the policy's key


@dataclass
class Member:
    """One request waiting in the pool for its next slice."""

    request_id: str
    service: str
    model: str
    arrival_s: float
    input_tokens: int  # prompt + tokens so far: the length its next slice prefills
    slot: asyncio.Future[Assignment]


@dataclass
class EngineView:
    """What the central loop needs of an engine hosting the model."""

    engine_id: str
    kv_capacity_tokens: int | None  # None: unknown yet


@dataclass
class SclsCentral:
    """The interval loop and the members' slots around the policy (one per scheduler)."""

    engines_for: Callable[[str], list[EngineView]]  # live engines hosting a model
    slice_iterations: int = 128
    lam: float = 0.5
    gamma_s: float = 6.0
    zeta: float = 0.9
    max_batch: int = 256
    cost: Any = None  # an SCLS cost (t_serve) or its coefficients; None: the policy's default
    policy: SclsCentralPolicy = field(init=False)
    rounds: int = 0  # intervals that offloaded at least one batch
    _models: dict[str, None] = field(default_factory=dict)  # every model pooled so far

    def __post_init__(self) -> None:
        positive_int("max_batch", self.max_batch)
        self.policy = SclsCentralPolicy(SclsCentralOptions(
            cost=self.cost, slice_iterations=self.slice_iterations, lam=self.lam, gamma_s=self.gamma_s,
            slice_end="recompute", zeta=self.zeta, oversized="alone", series=False,
        ))  # fmt: skip

    @classmethod
    def from_options(
        cls, engines_for: Callable[[str], list[EngineView]], options: dict[str, Any]
    ) -> SclsCentral:
        known = {"slice_iterations", "lam", "gamma_s", "zeta", "max_batch", "cost"}
        if bad := sorted(set(options) - known):
            raise ValueError(f"--scls-options: unknown keys {bad}; valid: {sorted(known)}")
        return cls(engines_for, **options)

    @property
    def maxmin(self):
        """The max-min books (Eq. 11's loads)."""
        return self.policy.maxmin

    # ------------------------------------------------------------------------------------------ pool
    def enqueue(
        self, request_id: str, service: str, model: str, arrival_s: float, input_tokens: int
    ) -> Member:
        m = Member(request_id, service, model, arrival_s, max(1, input_tokens),
                   asyncio.get_running_loop().create_future())  # fmt: skip
        self.policy.add(PoolEntry(request_id, model, arrival_s, m.input_tokens, m))
        self._models[model] = None
        return m

    def withdraw(self, member: Member) -> None:
        """A request left while waiting (cancelled): out of the pool."""
        e = self.policy.pool.get(member.request_id)
        if e is not None and e.payload is member:
            self.policy.remove(member.request_id)

    def returned(self, a: Assignment) -> None:
        """A member's slice ended (any outcome); the batch's estimate leaves its engine's load once
        every member is back (Eq. 11's bookkeeping)."""
        if a.batch is not None:
            self.policy.member_back(a.batch)

    def waiting(self) -> dict[str, int]:
        return self.policy.waiting()

    # ------------------------------------------------------------------------------------------ loop
    def interval(self) -> float:
        """Eq. 12 over the engines hosting any pooled model (Γ when there are none)."""
        return self.policy.interval({e.engine_id for model in self._models for e in self.engines_for(model)})

    async def run(self) -> None:
        """Every interval: plan and offload each model's pool."""
        while True:
            await asyncio.sleep(self.interval())
            try:
                self.tick()
            except Exception:  # a bad round must not stop the loop
                log.exception("scls_central: scheduling round failed")

    def tick(self) -> int:
        """One scheduling round over every pool; returns the number of batches offloaded."""
        for e in list(self.policy.pool.values()):
            if e.payload.slot.done():  # cancelled while waiting
                self.policy.remove(e.request_id)
        plan = self.policy.plan(self._workers, self.max_batch)
        for off in plan.assigned:
            b = off.batch
            a = Assignment(off.worker, f"scls-{b.seq}", len(b.request_ids), b)
            for e in off.entries:
                e.payload.slot.set_result(a)
        if plan.assigned:
            self.rounds += 1
        return len(plan.assigned)

    def _workers(self, model: str) -> list[WorkerView]:
        return [WorkerView(e.engine_id, e.kv_capacity_tokens) for e in self.engines_for(model)]

    # ---------------------------------------------------------------------------------------- slices
    async def next_slice(
        self, request_id: str, service: str, model: str, arrival_s: float, input_tokens: int
    ) -> Assignment:
        """Wait in the pool for the request's next slice (out of the pool if cancelled meanwhile)."""
        member = self.enqueue(request_id, service, model, arrival_s, input_tokens)
        try:
            return await member.slot
        except asyncio.CancelledError:
            self.withdraw(member)
            raise

    def slice_request(
        self, req: engine_pb2.GenerateRequest, delivered: list[int], n_tokens: int, total: int, a: Assignment
    ) -> engine_pb2.GenerateRequest:
        """``req`` as one slice of batch ``a``: resumed from the ``delivered`` tokens (``n_tokens`` so far),
        at most S more of them (``total`` in all)."""
        out = engine_pb2.GenerateRequest()
        out.CopyFrom(req)
        out.resume_token_ids.extend(delivered)
        out.sampling.max_tokens = min(total, n_tokens + self.slice_iterations)
        out.batch_id, out.batch_size = a.batch_id, a.batch_size
        return out

    @staticmethod
    def unfinished(finish_reason: int, n_tokens: int, total: int) -> bool:
        """A slice that ended at its token cap (or moved) with tokens still to produce: back to the pool."""
        return finish_reason in SLICE_ENDS and n_tokens < total
