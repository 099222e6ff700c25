"""The executor's side of one request: its stream, detokenizer, sampler and completion so far (the
engine core holds its scheduling state in ``core``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from llmfleet.engine_core import CoreRequest

from llmfleet_engine.model_host import HostedModel
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
    finished: bool = False
    worker_text: bool = field(init=False)  # stop strings: the worker needs the text

    def __post_init__(self) -> None:
        self.worker_text = self.sink.text is None

    @property
    def request_id(self) -> str:
        return self.req.request_id

    def full_ids(self) -> list[int]:
        return [*self.req.prompt_token_ids, *self.tokens]
