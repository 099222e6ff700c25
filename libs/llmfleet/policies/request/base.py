"""Engine-local request scheduling: the interface shared by the engine node and the simulator.

A request policy decides, before every iteration, which requests of ONE model run together, and which
running request to preempt (recompute) when the KV pool runs out. It is pure: plain Python over the
dataclasses below, time always passed in, no I/O.

Calling contract (engine and simulator alike; one policy object per engine, one thread):

1. ``on_arrival(req, now)`` once when a request enters the engine (before a ``next_batch`` sees it).
2. Every iteration: ``batch = next_batch(waiting, running, pool, limits, now)``; ``None`` means nothing
   can run now (idle until an arrival or a finish). ``waiting`` are requests that hold no KV (phase
   "prefill"), ``running`` those that do (phase "decode"); the policy goes by which sequence a request
   is in, never mutates either sequence, and only writes the policy-owned fields of the requests.
   Run the batch, then ``on_iteration(batch, duration_s, now_end, requests_of_the_batch)``; prefilled
   requests move to ``running`` (phase "decode").
3. A completed request: ``on_finish(req, now)`` after the ``on_iteration`` of its last iteration.
4. A decode whose block append fails: ``victim = preemption_victim(running, now)`` (it may be a member of
   the batch in flight: drop it from that batch), free its KV, fold what it generated into
   ``prompt_tokens`` (and reset ``generated``/``max_new_tokens`` accordingly, so ``context_tokens`` stays
   the KV length) and put it back into ``waiting``. Policy-owned fields are kept, and so is what a
   policy keeps of the request in its own table.
5. A cancelled request is simply dropped: a policy that keeps per-request state in its own table lets
   it go with the request object.

If ``next_batch`` answers ``None`` while nothing is running, :func:`stuck_requests` names the waiting
requests that can never be admitted with the pool as it is; the engine should fail them loudly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

Phase = Literal["prefill", "decode"]
BatchPhase = Literal["prefill", "decode", "mixed"]
_PHASES = ("prefill", "decode")
_BATCH_PHASES = ("prefill", "decode", "mixed")


@dataclass
class SchedRequest:
    """One request as the engine-local scheduler sees it (mutable).

    ``service`` is the SLO/budget group (the service name, or the model name when unknown); ``model`` is
    what a batch must not mix. ``prompt_tokens`` is what a prefill must process (the prompt plus anything
    generated before a preemption). The fields after ``phase`` belong to the policy; the engine never
    writes them.
    """

    request_id: str
    service: str
    model: str
    arrival_s: float
    prompt_tokens: int
    max_new_tokens: int
    generated: int = 0
    phase: Phase = "prefill"
    # set by whoever submits (scheduler or simulator) from a length predictor; None when unknown
    predicted_output_tokens: float | None = None
    deadline_s: float | None = None  # absolute SLO deadline (UELLM), None when the service has none
    # a static batch formed upstream (SCLS central scheduling: the scheduler's DP), run as one by the
    # `given` batching policy; "" / 0 when the request is not part of one
    batch_id: str = ""
    batch_size: int = 0
    # set by whoever submits: the request's priority (higher runs first) and its tenant (the API key's
    # name, "" when none), what preemption for priority and fairness reads (``preemption``)
    request_priority: int = 0
    tenant: str = ""
    # policy-owned bookkeeping (the engine never touches these)
    priority: float = 0.0
    first_scheduled_s: float | None = None
    last_run_s: float | None = None  # end of the last iteration it took part in (starvation clock)
    executed_s: float = 0.0  # summed durations of the iterations it took part in (its execution time)

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ValueError("SchedRequest needs a non-empty request_id")
        if min(self.prompt_tokens, self.max_new_tokens, self.generated) < 0:
            raise ValueError(f"token counts must be >= 0 for request {self.request_id!r}")
        if self.phase not in _PHASES:
            raise ValueError(f"phase must be one of {_PHASES}, got {self.phase!r}")
        if not math.isfinite(self.arrival_s):
            raise ValueError(f"arrival_s must be finite for request {self.request_id!r}")

    @property
    def context_tokens(self) -> int:
        """Tokens in the KV cache once prefilled: prompt_tokens + generated."""
        return self.prompt_tokens + self.generated


@dataclass(frozen=True)
class PoolView:
    """What a policy may know about the KV pool: free blocks, the watermark, block size per model."""

    free_blocks: int
    watermark_blocks: int
    tokens_per_block: Mapping[str, int]

    def __post_init__(self) -> None:
        if self.free_blocks < 0 or self.watermark_blocks < 0:
            raise ValueError("free_blocks and watermark_blocks must be >= 0")
        if min(self.tokens_per_block.values(), default=1) < 1:
            bad = {m: t for m, t in self.tokens_per_block.items() if t < 1}
            raise ValueError(f"tokens_per_block must be >= 1: {bad}")

    @property
    def available_blocks(self) -> int:
        """Blocks that admissions may take: free blocks above the watermark."""
        return max(0, self.free_blocks - self.watermark_blocks)

    def blocks_for(self, model: str, tokens: int) -> int:
        """Blocks holding ``tokens`` tokens of ``model``: ceil(tokens / T_m)."""
        try:
            t = self.tokens_per_block[model]
        except KeyError:
            raise ValueError(
                f"no block size for model {model!r}; known: {sorted(self.tokens_per_block)}"
            ) from None
        return -(-max(0, tokens) // t)


@dataclass(frozen=True)
class BatchLimits:
    """Per-iteration limits: request count, and total prompt tokens of the prefills in one batch.

    A single prompt longer than ``max_prefill_tokens`` still runs, as the only prefill of its batch.
    """

    max_requests: int = 32
    max_prefill_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.max_requests < 1 or self.max_prefill_tokens < 1:
            raise ValueError(f"BatchLimits must be positive: {self}")


@dataclass(frozen=True)
class Batch:
    """One iteration's work: requests of ONE model. fcfs may mix phases ("mixed"); DB never does."""

    model: str
    phase: BatchPhase
    request_ids: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.phase not in _BATCH_PHASES:
            raise ValueError(f"batch phase must be one of {_BATCH_PHASES}, got {self.phase!r}")
        if not self.request_ids:
            raise ValueError("a batch holds at least one request")


@runtime_checkable
class RequestPolicy(Protocol):
    name: str

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        """A new request entered the engine."""
        ...

    def next_batch(
        self,
        waiting: Sequence[SchedRequest],
        running: Sequence[SchedRequest],
        pool: PoolView,
        limits: BatchLimits,
        now: float,
    ) -> Batch | None:
        """The next iteration's batch, or None when nothing can run.

        Admitting a waiting request takes ``pool.blocks_for(model, prompt_tokens + 1)`` blocks above the
        watermark, summed over the batch; decodes need no admission check.
        """
        ...

    def on_iteration(
        self, batch: Batch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None:
        """``batch`` ran for ``duration_s`` and ended at ``now``; ``requests`` are its members."""
        ...

    def on_finish(self, req: SchedRequest, now: float) -> None:
        """``req`` completed at ``now``."""
        ...

    def preemption_victim(self, running: Sequence[SchedRequest], now: float) -> SchedRequest:
        """The running request to preempt (recompute) when KV runs out."""
        ...


# ---------------------------------------------------------------------------------------------------
# helpers shared by the policies (pure)


def arrival_key(req: SchedRequest) -> tuple[float, str]:
    """Arrival order, ties by request id: the deterministic FCFS order."""
    return (req.arrival_s, req.request_id)


def admission_blocks(pool: PoolView, req: SchedRequest) -> int:
    """Blocks a waiting request needs to be admitted: its prompt plus the first generated token."""
    return pool.blocks_for(req.model, req.prompt_tokens + 1)


def fits_alone(pool: PoolView, req: SchedRequest) -> bool:
    return admission_blocks(pool, req) <= pool.available_blocks


def admit_prefills(
    candidates: Iterable[SchedRequest], pool: PoolView, limits: BatchLimits, slots: int
) -> list[SchedRequest]:
    """Take ``candidates`` in the given order while they fit; stop at the first that does not.

    Fits = a free slot (``slots``), the batch's prefill tokens within ``limits.max_prefill_tokens``
    (the first prefill is exempt: a longer prompt runs alone) and the summed admission blocks within
    ``pool.available_blocks`` (no over-admission within one batch).
    """
    chosen: list[SchedRequest] = []
    tokens = blocks = 0
    avail = pool.available_blocks
    for req in candidates:
        if len(chosen) >= slots:
            break
        need = admission_blocks(pool, req)
        if blocks + need > avail:
            break
        if chosen and tokens + req.prompt_tokens > limits.max_prefill_tokens:
            break
        chosen.append(req)
        tokens += req.prompt_tokens
        blocks += need
    return chosen


def batch_members(batch: Batch, requests: Sequence[SchedRequest]) -> list[SchedRequest]:
    """The requests of ``requests`` that belong to ``batch`` (extra ones are ignored)."""
    ids = set(batch.request_ids)
    return [r for r in requests if r.request_id in ids]


def mark_ran(req: SchedRequest, duration_s: float, now: float) -> None:
    """Record that ``req`` took part in an iteration of ``duration_s`` that ended at ``now``."""
    if req.first_scheduled_s is None:
        req.first_scheduled_s = now - duration_s
    req.last_run_s = now
    req.executed_s += duration_s


def check_duration(duration_s: float) -> None:
    if not (math.isfinite(duration_s) and duration_s >= 0):
        raise ValueError(f"iteration duration must be finite and >= 0, got {duration_s!r}")


def stuck_requests(
    waiting: Sequence[SchedRequest], running: Sequence[SchedRequest], pool: PoolView
) -> list[SchedRequest]:
    """Waiting requests that can never be admitted: nothing runs (so nothing will free KV) and their
    admission alone exceeds the blocks above the watermark. Empty while anything is running."""
    if running:
        return []
    return [r for r in waiting if not fits_alone(pool, r)]
