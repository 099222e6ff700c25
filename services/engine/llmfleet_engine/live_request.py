"""The executor's side of one request: its stream, detokenizer, sampler and completion so far (the
engine core holds its scheduling state in ``core``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from llmfleet.engine_core import CoreRequest, StepPlan
from llmfleet.kvblocks import BlockAllocator
from llmfleet.policies.request import SchedRequest

from llmfleet_engine.hosted_model import HostedModel
from llmfleet_engine.native.runner import SeqStep
from llmfleet_engine.outputs import EngineUsage, FinishReason
from llmfleet_engine.sampling import make_generator
from llmfleet_engine.stream import ChunkSink
from llmfleet_engine.text import TextStream
from llmfleet_engine.validation import GenerationRequest

if TYPE_CHECKING:
    from llmfleet.metrics.engine import EngineMetrics

    from llmfleet_engine.delivery import Delivery

# how a token ended its request: (reason, the token ids it adds, the worker's text or None, its index)
Outcome = tuple[FinishReason, tuple[int, ...], str | None, int]


@dataclass(eq=False)
class LiveRequest:
    """The executor's side of one request (the core holds its scheduling state in ``core``)."""

    req: GenerationRequest
    model: HostedModel
    sink: ChunkSink  # the output's way to the consumer (``sink.text`` set: the consumer detokenizes)
    text: TextStream
    generator: torch.Generator | None
    core: CoreRequest = field(init=False)
    tokens: list[int] = field(default_factory=list)  # completion ids, resumed ones first
    attached: bool = True  # False for an imported request until a consumer attaches
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None  # when its latest token was produced (inter-token latency)
    cached_tokens: int | None = None  # prompt tokens its first prefill here took from the prefix cache
    finished: bool = False
    worker_text: bool = field(init=False)  # stop strings: the worker needs the text

    def __post_init__(self) -> None:
        self.worker_text = self.sink.text is None

    @property
    def request_id(self) -> str:
        return self.req.request_id

    def full_ids(self) -> list[int]:
        return [*self.req.prompt_token_ids, *self.tokens]

    def take_token(self, token: int) -> tuple[FinishReason | None, tuple[int, ...], str | None, int]:
        """Record ``token`` (an EOS is not output): whether it ends the request (EOS, a stop string,
        ``max_tokens``), the ids it adds, the text (the worker's, for requests with stop strings; None:
        the consumer's detokenizer flushes what it holds) and its index."""
        reason: FinishReason | None = None
        token_ids: tuple[int, ...] = ()
        text: str | None = ""
        if token in self.model.loaded.eos_token_ids:
            text, reason = (self.text.finish() if self.worker_text else None), FinishReason.EOS
        else:
            token_ids = (token,)
            pushed = ""
            if self.worker_text:
                pushed, stopped = self.text.push(token)
                if stopped:
                    reason = FinishReason.STOP
            text = pushed
            if reason is None and len(self.tokens) + 1 >= self.req.sampling.max_tokens:
                text = pushed + self.text.finish() if self.worker_text else None
                reason = FinishReason.LENGTH
        index = len(self.tokens)
        self.tokens.extend(token_ids)
        return reason, token_ids, text, index

    def token_metrics(self, metrics: EngineMetrics, now: float, produced: int = 1) -> None:
        """A step gave this request a token (``produced``: 0 for an EOS, which is not output): first
        token (TTFT, prompt tokens) or the gap since the previous one (inter-token latency)."""
        model = self.req.model
        if self.last_token_s is None:
            metrics.first_token(model, self.req.prompt_tokens, now - self.req.since_s)
        else:
            metrics.inter_token(model, now - self.last_token_s)
        self.last_token_s = now
        metrics.tokens(model, produced)

    def usage(self, now: float) -> EngineUsage:
        """The final chunk's usage, the request ending at ``now``."""
        arrival, since = self.req.arrival_s, self.req.since_s
        return EngineUsage(
            prompt_tokens=self.req.prompt_tokens,
            completion_tokens=len(self.tokens),
            queue_s=max(0.0, (self.scheduled_s if self.scheduled_s is not None else now) - arrival),
            ttft_s=max(0.0, self.first_token_s - since) if self.first_token_s is not None else 0.0,
            latency_s=max(0.0, now - since),
            cached_tokens=min(self.cached_tokens or 0, self.req.prompt_tokens),
        )


def new_live_request(
    request: GenerationRequest,
    model: HostedModel,
    delivery: Delivery,
    loop: asyncio.AbstractEventLoop,
    tokens: list[int],
) -> LiveRequest:
    """The executor's state of ``request`` on ``model``, resumed from ``tokens`` (its core request
    prefills them with the prompt); its output goes through ``delivery`` to ``loop``."""
    sampling = request.sampling
    text = TextStream(model.loaded.tokenizer, sampling.stop, context_ids=request.prompt_token_ids)
    text.replay(tokens)
    sched = SchedRequest(
        request_id=request.request_id,
        service=request.group,
        model=model.loaded.name,  # an adapter's request runs on its base
        arrival_s=request.arrival_s,
        prompt_tokens=request.prompt_tokens + len(tokens),  # known tokens are prefilled together
        max_new_tokens=max(1, sampling.max_tokens - len(tokens)),
        predicted_output_tokens=request.predicted_output_tokens,
        deadline_s=None if request.deadline_s is None else request.arrival_s + request.deadline_s,
        batch_id=request.batch_id,
        batch_size=request.batch_size,
        request_priority=request.priority,
        tenant=request.tenant,
    )
    # without stop strings the consumer detokenizes (on its event loop, off the worker's path)
    sink = delivery.sink(request.request_id, loop, None if sampling.stop else text, len(tokens))
    state = LiveRequest(
        req=request,
        model=model,
        sink=sink,
        text=text,
        generator=None if sampling.greedy else make_generator(sampling.seed),
        tokens=tokens,
    )
    state.core = CoreRequest(
        sched, request.prompt_tokens, sampling.max_tokens, state, request.prompt_token_ids,
        output_ids=lambda: state.tokens,  # its sampled tokens: a finished request caches its output blocks
        adapter=None if request.model == model.loaded.name else request.model,  # keys its prefix blocks too
    )  # fmt: skip
    return state


def seq_steps(plan: StepPlan, alloc: BlockAllocator, now: float) -> list[SeqStep]:
    """The forward inputs of ``plan``'s members (their KV slots are allocated): a prefill feeds prompt +
    completion so far after the ``cached`` tokens it took from the prefix cache, a decode its newest
    token at ``kv_tokens``."""
    prefills = set(map(id, plan.prefills))
    steps = []
    for r in plan.members:
        state: LiveRequest = r.payload
        rid = r.sched.request_id
        table = alloc.table(rid)
        blocks, t = table.blocks, table.tokens_per_block
        if id(r) in prefills:
            full = state.full_ids()
            n = len(full)
            if n > table.num_tokens:
                raise IndexError(f"{rid!r} holds {table.num_tokens} slots, its prefill needs {n}")
            if state.scheduled_s is None:
                state.scheduled_s = now
            c = r.cached
            new = full[c:] if c else full
            slots_block, slots_offset = [blocks[p // t] for p in range(c, n)], [p % t for p in range(c, n)]
            steps.append(SeqStep(new, c, blocks, slots_block, slots_offset, r.adapter_slot))
        else:
            pos = r.kv_tokens  # the newest token's slot (the core appended it)
            steps.append(
                SeqStep([state.tokens[-1]], pos, blocks, [blocks[pos // t]], [pos % t], r.adapter_slot)
            )
    return steps
