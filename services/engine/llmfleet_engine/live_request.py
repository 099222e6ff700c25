"""The executor's side of one request: its stream, detokenizer, sampler and completion so far (the
engine core holds its scheduling state in ``core``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from llmfleet.engine_core import CoreRequest, StepPlan
from llmfleet.kvblocks import BlockAllocator

from llmfleet_engine.model_host import HostedModel
from llmfleet_engine.native.runner import SeqStep
from llmfleet_engine.stream import ChunkSink
from llmfleet_engine.text import TextStream
from llmfleet_engine.validation import GenerationRequest


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
    finished: bool = False
    worker_text: bool = field(init=False)  # stop strings: the worker needs the text

    def __post_init__(self) -> None:
        self.worker_text = self.sink.text is None

    @property
    def request_id(self) -> str:
        return self.req.request_id

    def full_ids(self) -> list[int]:
        return [*self.req.prompt_token_ids, *self.tokens]


def seq_steps(plan: StepPlan, alloc: BlockAllocator, now: float) -> list[SeqStep]:
    """The forward inputs of ``plan``'s members (their KV slots are allocated): a prefill feeds prompt +
    completion so far from position 0, a decode its newest token at ``kv_tokens``."""
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
            steps.append(
                SeqStep(full, 0, blocks, [blocks[p // t] for p in range(n)], [p % t for p in range(n)])
            )
        else:
            pos = r.kv_tokens  # the newest token's slot (the core appended it)
            steps.append(SeqStep([state.tokens[-1]], pos, blocks, [blocks[pos // t]], [pos % t]))
    return steps
