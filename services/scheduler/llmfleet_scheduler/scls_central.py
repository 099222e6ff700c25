"""SCLS central scheduling in the scheduler (Cheng et al. 2024, §4), for services with
``dispatch: scls_central``.

The scheduler keeps the request pool, per model. Every interval T (Eq. 12: max(λ·min_w T_load(w), Γ))
it partitions the pool with the DP (Algorithm 1, ``SclsSliceBatcher.plan``: requests sorted by input
length, contiguous runs minimising Σ T_serve(N, L, S), each run memory-feasible on one engine) and
offloads the batches max-min (Eq. 11, ``SclsMaxMin.assign_batches``: longest estimate first to the
least-loaded engine; an engine's load drops by the batch's *estimate* when the batch is back). Each
member then runs one slice on its engine: the relay sends it tagged with the batch (``batch_id``,
``batch_size``; the engine's ``given`` batching policy runs the batch as one static batch) and with
``max_tokens`` capped at S more tokens. A member that ends its slice unfinished comes back to the pool
with its tokens so far; its next slice re-prefills prompt + tokens wherever it lands (the paper's
recompute mode).

Departures from the paper, each for a stated reason:

* the scheduler holds no tokenizer: a request's input length is its prompt estimated at 4 bytes a token
  (``approx_token_count``) until an engine reports the real count, plus its tokens so far;
* the DP's memory bound is one engine's KV capacity (the smallest among the engines hosting the
  model), from the engines' registered ``kv_capacity_bytes`` and reported bytes per token; without a
  report yet, the bound is the batch-size cap alone;
* the DP has no prefill-token cap (the paper bounds memory only).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmfleet.policies.batching.scls_dp import SclsSliceBatcher
from llmfleet.policies.dispatch.scls_maxmin import SclsMaxMin
from llmfleet.policies.request.base import BatchLimits, PoolView, SchedRequest

log = logging.getLogger(__name__)

MODE = "scls_central"  # llmfleet.policies.dispatch.SCHEDULER_MODES
UNBOUNDED = 1 << 40  # "no limit" for BatchLimits / PoolView fields that must be positive


@dataclass(frozen=True)
class Assignment:
    engine_id: str
    batch_id: str
    batch_size: int


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
    """The pool, the interval loop and the max-min books (one per scheduler; models are independent)."""

    engines_for: Callable[[str], list[EngineView]]  # live engines hosting a model
    slice_iterations: int = 128
    lam: float = 0.5
    gamma_s: float = 6.0
    zeta: float = 0.9
    max_batch: int = 256
    cost: Any = None  # an SCLS cost (t_serve) or its coefficients; None: the batcher's default
    pools: dict[str, list[Member]] = field(default_factory=dict)
    batcher: SclsSliceBatcher = field(init=False)
    maxmin: SclsMaxMin = field(init=False)
    _outstanding: dict[str, int] = field(default_factory=dict)  # batch id -> members not back yet
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    rounds: int = 0  # intervals that offloaded at least one batch

    def __post_init__(self) -> None:
        self.batcher = SclsSliceBatcher(self.cost, self.slice_iterations, self.zeta, self.max_batch)
        self.maxmin = SclsMaxMin(self.cost, self.slice_iterations, self.lam, self.gamma_s)

    @classmethod
    def from_options(
        cls, engines_for: Callable[[str], list[EngineView]], options: dict[str, Any]
    ) -> SclsCentral:
        known = {"slice_iterations", "lam", "gamma_s", "zeta", "max_batch", "cost"}
        if bad := sorted(set(options) - known):
            raise ValueError(f"--scls-options: unknown keys {bad}; valid: {sorted(known)}")
        return cls(engines_for, **options)

    # ------------------------------------------------------------------------------------------ pool
    def enqueue(
        self, request_id: str, service: str, model: str, arrival_s: float, input_tokens: int
    ) -> Member:
        m = Member(
            request_id,
            service,
            model,
            arrival_s,
            max(1, input_tokens),
            asyncio.get_running_loop().create_future(),
        )
        self.pools.setdefault(model, []).append(m)
        return m

    def withdraw(self, member: Member) -> None:
        """A request left while waiting (cancelled): out of the pool."""
        pool = self.pools.get(member.model, [])
        if member in pool:
            pool.remove(member)

    def returned(self, a: Assignment) -> None:
        """A member's slice ended (any outcome); the batch's estimate leaves its engine's load once
        every member is back (Eq. 11's bookkeeping)."""
        left = self._outstanding.get(a.batch_id, 0) - 1
        if left > 0:
            self._outstanding[a.batch_id] = left
            return
        self._outstanding.pop(a.batch_id, None)
        self.maxmin.complete_batch(a.batch_id)

    # ------------------------------------------------------------------------------------------ loop
    def interval(self) -> float:
        """Eq. 12 over the engines hosting any pooled model (Γ when there are none)."""
        engines = {e.engine_id for model in self.pools for e in self.engines_for(model)}
        return self.maxmin.interval(engines) if engines else self.gamma_s

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
        offloaded = 0
        for model, pool in list(self.pools.items()):
            live = [m for m in pool if not m.slot.done()]
            engines = self.engines_for(model)
            if not live or not engines:
                self.pools[model] = live
                continue
            self.pools[model] = []
            offloaded += self._offload(model, live, engines)
        if offloaded:
            self.rounds += 1
        return offloaded

    def _offload(self, model: str, members: Sequence[Member], engines: Sequence[EngineView]) -> int:
        scheds = [
            SchedRequest(
                request_id=m.request_id,
                service=m.service,
                model=m.model,
                arrival_s=m.arrival_s,
                prompt_tokens=m.input_tokens,
                max_new_tokens=self.slice_iterations,
            )
            for m in members
        ]
        caps = [e.kv_capacity_tokens for e in engines if e.kv_capacity_tokens]
        # one-token blocks: the DP's memory test is n · (L + S) tokens <= zeta · capacity
        pool = PoolView(
            free_blocks=min(caps) if caps else UNBOUNDED, watermark_blocks=0, tokens_per_block={model: 1}
        )
        limits = BatchLimits(max_requests=self.max_batch, max_prefill_tokens=UNBOUNDED)
        planned = self.batcher.plan(scheds, pool, limits)
        batches = [(batch.request_ids, est) for batch, est in planned]
        planned_ids = {rid for ids, _ in batches for rid in ids}
        # a request larger than an engine's pool alone still runs alone (the engine preempts or refuses)
        for s in scheds:
            if s.request_id not in planned_ids:
                batches.append(((s.request_id,), self.batcher.estimate([s])))
        keyed = {f"scls-{next(self._ids)}": (ids, est) for ids, est in batches}
        by_id = {m.request_id: m for m in members}
        assigned = self.maxmin.assign_batches(
            [(b, est) for b, (_, est) in keyed.items()], [e.engine_id for e in engines]
        )
        for bid, engine in assigned:
            ids = keyed[bid][0]
            self._outstanding[bid] = len(ids)
            for rid in ids:
                by_id[rid].slot.set_result(Assignment(engine, bid, len(ids)))
        return len(keyed)

    def waiting(self) -> dict[str, int]:
        return {model: len(pool) for model, pool in self.pools.items() if pool}
