"""Workload → requests for a live cluster: each trace request keeps its arrival time, gets a prompt of
exactly its prompt-token count and ``max_tokens`` = its output length. The prompt is N seeded words of
the workload's vocabulary (:data:`~llmfleet.workload.prompts.WORDS`): the emulated engines' word-level
tokenizer gives each exactly one token id (no BOS), and two requests' prompts share no block of a
prefix cache, as the simulator, which knows their lengths only, assumes. (A word the tokenizer does not
know is ``<unk>``: prompts of unknown words would all be the same ids and hit each other's cached
blocks.) A request
with prompt content (system prompts, conversations: :mod:`llmfleet.workload.prompts`) sends that
content's words instead, so requests that share a prefix in the workload share it live. A
closed-loop turn keeps what it ``follows`` and its think time (:mod:`llmfleet.workload.followups`).

Services are assigned with ``llmfleet.sim.run.assign_services`` (k-means over lengths, the i-th
shortest cluster to the i-th service), so ``llmfleet sim`` and ``llmfleet load`` on the same trace and
services send every request to the same service.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmfleet.sim.run import assign_services
from llmfleet.sim.spec import SimService
from llmfleet.workload import Workload, WorkloadRequest
from llmfleet.workload.prompts import prompt_text, segment_text, stable_seed


@dataclass(frozen=True)
class ReplayRequest:
    """One request to send: when (seconds from the start), to which service, its lengths."""

    request_id: str
    arrival_s: float
    service: str
    prompt_tokens: int
    max_tokens: int
    index: int = 0  # position in the workload (seeds the prompt)
    source: WorkloadRequest | None = None  # the workload's request, when it has prompt content
    follows: str = ""  # a closed-loop turn: sent think_s after this request finished
    think_s: float = 0.0

    @property
    def session(self) -> str:
        """The conversation the request continues ("" when none)."""
        return self.source.session if self.source is not None else ""

    def prompt(self, seed: int = 0) -> str:
        if self.source is not None:
            return prompt_text(self.source)
        return synthetic_prompt(self.prompt_tokens, seed, self.index)

    def next_prompt(self, history: str) -> str:
        """A closed-loop turn's prompt: ``history`` (the turn before's prompt and answer, as sent and
        received) and this turn's own new message (the last segment of its content; without content,
        its own synthetic prompt)."""
        if self.source is not None and self.source.parts:
            own = segment_text(*self.source.parts[-1])
        else:
            own = synthetic_prompt(self.prompt_tokens, 0, self.index)
        return f"{history} {own}" if history else own


def synthetic_prompt(n_tokens: int, seed: int, index: int) -> str:
    """``n_tokens`` words (at least one: an empty prompt is refused): the workload's seeded segment of
    (seed, index) (:func:`~llmfleet.workload.prompts.segment_text`)."""
    return segment_text(stable_seed("replay", seed, index), max(1, n_tokens))


@dataclass(frozen=True)
class _Services:
    """What ``assign_services`` reads of a spec: its ordered services (no catalog check: live models
    need not be cost-model names)."""

    services: tuple[SimService, ...]


def replay_requests(workload: Workload, services: Sequence[SimService]) -> list[ReplayRequest]:
    """The workload's requests, labelled with ``services`` as ``llmfleet sim`` labels them, in arrival order."""
    if not services:
        raise ValueError("no service to send requests to")
    labelled = assign_services(workload, _Services(tuple(services)))
    return [
        ReplayRequest(
            r.request_id,
            r.arrival_s,
            r.service,
            r.prompt_tokens,
            r.output_tokens,
            i,
            r if r.has_content else None,
            r.follows,
            r.think_s,
        )
        for i, r in enumerate(labelled.requests)
    ]
