"""The engine core's per-request state, and the step plan / step result it exchanges with its driver."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from llmfleet.kvblocks.prefix import prefix_block_hashes
from llmfleet.policies.batching.base import StaticBatch
from llmfleet.policies.request.base import Batch, SchedRequest


class CoreRequest:
    """One request in an engine core.

    ``sched`` is what the policy sees (``prompt_tokens`` = what the next prefill processes, i.e. the
    prompt plus everything generated before a preemption; ``generated`` = tokens since that prefill).
    ``prompt`` is the original prompt length, ``max_tokens`` the output cap; a resumed request's
    ``sched.prompt_tokens`` holds its earlier output after the prompt, so ``produced`` (every output
    token so far) is read off ``sched``, the one count of the request's output. While it holds KV, ``kv_tokens`` = context − 1: the newest
    sampled token is not in the cache yet. ``payload`` is the driver's object (the live executor's
    request state, the simulator's record); the core never reads it.

    ``prompt_ids``: the prompt's token ids when known (None: only its length is), for prefix caching;
    ``output_ids``: when known, a function giving its output's token ids so far (the live engine's
    sampled tokens; the simulator's workload answer), so that its output blocks are cached too as
    decoding fills them; ``cached`` is how many tokens its latest prefill took from the prefix cache
    (the prefill computes the ones after them); ``filled``: how many of its leading blocks in the pool
    the core has named since its KV was allocated (0 again when the KV goes).

    ``adapter``: the LoRA adapter it runs (None: its model itself). Its request runs on its base model
    (``sched.model``) and holds a slot of the base's adapter pool while it runs: ``adapter_slot`` (-1
    while it holds none), acquired when the core admits it (:mod:`llmfleet.engine_core.adapter_slots`).

    ``prefix_key``: the name the prefix cache's hash chain is keyed by (None: the adapter, else
    ``sched.model``), so two adapters of one base, or an adapter and its base, never share a cached block.
    """

    __slots__ = (
        "_chain",
        "_hashes",
        "_outputs",
        "adapter",
        "adapter_slot",
        "cached",
        "filled",
        "max_tokens",
        "output_ids",
        "paused",
        "payload",
        "preemptions",
        "prefix_key",
        "prompt",
        "prompt_ids",
        "sched",
    )

    def __init__(
        self,
        sched: SchedRequest,
        prompt: int,
        max_tokens: int,
        payload: Any = None,
        prompt_ids: Collection[int] | None = None,
        output_ids: Callable[[], Sequence[int]] | None = None,
        prefix_key: str | None = None,
        adapter: str | None = None,
    ) -> None:
        if prompt < 0 or max_tokens < 1 or sched.prompt_tokens < prompt:
            raise ValueError(
                f"request {sched.request_id!r}: prompt >= 0, max_tokens >= 1, "
                "sched.prompt_tokens >= prompt required"
            )
        self.sched = sched
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.payload = payload
        self.paused = False
        self.preemptions = 0
        self.prompt_ids = prompt_ids
        self.output_ids = output_ids
        self.adapter = adapter or None
        self.adapter_slot = -1
        self.prefix_key = (adapter or sched.model) if prefix_key is None else prefix_key
        self.cached = 0
        self.filled = 0
        self._hashes: tuple[int, list[int]] | None = None  # (tokens per block, the prompt's hashes)
        self._chain: tuple[int, list[int]] | None = None  # (tokens per block, prompt + output hashes)
        self._outputs: Sequence[int] | None = None  # output_ids() as last read

    def block_hashes(self, tokens_per_block: int) -> list[int]:
        """The hash chain of the prompt's full blocks of ``tokens_per_block`` (none without ids)."""
        if self.prompt_ids is None:
            return []
        memo = self._hashes
        if memo is None or memo[0] != tokens_per_block:
            ids = self.prompt_ids
            hashes = prefix_block_hashes(
                self.prefix_key, ids, tokens_per_block, self.prompt // tokens_per_block
            )
            memo = self._hashes = (tokens_per_block, hashes)
        return memo[1]

    def filled_block_hashes(self, tokens_per_block: int, full: int) -> list[int]:
        """The hash chain of prompt + output, at least its first ``full`` blocks (the list may run
        longer; callers slice it), or only the prompt's full blocks when the output's ids are unknown.
        Each block is hashed once: the chain grows as the sequence does."""
        head = self.block_hashes(tokens_per_block)
        if full <= len(head) or self.output_ids is None:
            return head
        assert self.prompt_ids is not None  # (head is empty without prompt ids: returned above)
        memo = self._chain
        if memo is None or memo[0] != tokens_per_block:
            memo = self._chain = (tokens_per_block, list(head))
        chain = memo[1]
        if len(chain) < full:
            t, p = tokens_per_block, self.prompt
            start, end = len(chain) * t, full * t
            ids = list(islice(self.prompt_ids, start, min(end, p))) if start < p else []
            out = self._outputs
            if out is None or len(out) < end - p:  # (a live engine's list grows in place: one call)
                out = self._outputs = self.output_ids()
            ids.extend(out[max(0, start - p) : end - p])
            chain += prefix_block_hashes(self.prefix_key, ids, t, parent=chain[-1] if chain else None)
        return chain

    @property
    def request_id(self) -> str:
        return self.sched.request_id

    @property
    def model(self) -> str:
        return self.sched.model

    @property
    def produced(self) -> int:
        """Output tokens so far, resumed ones included: those a prefill folded in after the prompt
        plus those generated since."""
        s = self.sched
        return s.prompt_tokens - self.prompt + s.generated

    @property
    def kv_tokens(self) -> int:
        """Tokens whose K/V is in the pool (valid while running)."""
        return self.sched.prompt_tokens + self.sched.generated - 1

    def fold(self) -> None:
        """Preemption / slice end / landing without KV: the next prefill rebuilds prompt + output."""
        s = self.sched
        produced = self.produced
        s.prompt_tokens = self.prompt + produced
        s.max_new_tokens = max(1, self.max_tokens - produced)
        s.generated = 0
        self.filled = 0

    def __repr__(self) -> str:
        s = self.sched
        return f"CoreRequest({s.request_id!r}, {s.phase}, prompt={s.prompt_tokens}, produced={self.produced})"


@dataclass(slots=True)
class StepPlan:
    """One step chosen by :meth:`EngineCore.schedule`.

    ``members`` are the requests computed, in batch order; ``prefills`` the subset that prefills
    (``sched.prompt_tokens − cached`` tokens each, after the ``cached`` it took from the prefix cache;
    the others decode their newest token). ``prefill_tokens`` sums the computed prompt tokens and
    ``prefill_sq`` their attention work, ``n · (n + 2c)`` for n tokens after c cached ones (``n²``
    without a cached prefix). ``iterations`` is 1
    for the live engine; a simulator may raise it (:meth:`EngineCore.extend`) to run the same members
    for k iterations as one chunk. Static mode: ``rows`` are all rows of the padded static batch
    (finished rows still hold their padded KV) and ``padded_len`` the longest prompt.
    """

    batch: Batch | StaticBatch
    model: str
    members: list[CoreRequest]
    prefills: list[CoreRequest]
    preempted: list[CoreRequest]
    prefill_tokens: int
    prefill_sq: int
    decodes: int
    context_tokens: int  # summed KV context of the decoding members
    waiting_seen: list[SchedRequest]
    running_seen: list[SchedRequest]
    iterations: int = 1
    static: bool = False
    rows: list[CoreRequest] = field(default_factory=list)
    padded_len: int = 0
    reserved: int = 0  # extra iterations whose KV was reserved up front (EngineCore.reserve_ahead)
    cached_tokens: int = 0  # prompt tokens the prefills took from the prefix cache (not computed)

    @property
    def request_ids(self) -> list[str]:
        return [r.sched.request_id for r in self.members]


@dataclass(slots=True)
class StepResult:
    """What :meth:`EngineCore.complete` did: ``finished`` requests left the core (KV freed, the policy's
    ``on_finish`` called) in member order; ``requeued`` went back to waiting (a static slice end or an
    OOM batch end, re-prefilled later); ``batch_rows`` are all rows of a static batch that ended."""

    finished: list[CoreRequest]
    requeued: list[CoreRequest]
    batch_rows: list[CoreRequest]


@dataclass(slots=True)
class StepEnd:
    """What the driver reports of a step that ended (:meth:`EngineCore.complete`'s arguments): when,
    how long it took (one duration, or one per iteration of a chunk), the tokens each member produced
    (None: ``plan.iterations`` each) and the members that finished."""

    now: float
    durations: Sequence[float] | float
    produced: Sequence[int] | None = None
    finished: Iterable[CoreRequest] = ()
