"""What the HTTP API needs from the scheduler (``Backend``) and the real one (``ServicerBackend``)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from llmfleet.api.v1 import scheduler_pb2
from llmfleet.rpc.mux import Emit

from llmfleet_scheduler.chat_template import ChatTemplates
from llmfleet_scheduler.http_api.auth import Credentials

# Streams a started request's chunks into the callback it is given (the last chunk final) and returns
# when the request ended; raises RequestFailed if it failed.
Follow = Callable[[Emit], Awaitable[None]]


class Backend(Protocol):
    """What the HTTP layer needs from the scheduler (a fake in unit tests)."""

    def ready(self) -> bool: ...

    def servable(self) -> tuple[bool, list[str]]:
        """Whether every service that must be served has an engine (and which have none)."""
        ...

    def services(self) -> dict[str, str]:
        """service name -> model name"""
        ...

    def submit(self, request: scheduler_pb2.SubmitRequest, who: Credentials) -> tuple[str, Follow]:
        """Start (or attach to) a request for the caller ``who``: its id and how to follow its chunks.
        Raises InvalidField or RequestFailed before streaming (or, where the refusal comes back later,
        from following)."""
        ...

    async def cancel(self, request_id: str) -> bool: ...

    async def render_chat(self, model: str, messages: list[tuple[str, str]]) -> str:
        """``(role, content)`` messages as one prompt, with ``model``'s chat template."""
        ...


@dataclass
class ServicerBackend:
    """The real backend: the gRPC servicer's own submit path."""

    servicer: Any  # SchedulerServicer (not imported: keeps this module light for tests)
    templates: ChatTemplates | None = None  # default: model sources from the servicer's directory

    def __post_init__(self) -> None:
        if self.templates is None:
            self.templates = ChatTemplates(self.servicer.directory.model_source)

    async def render_chat(self, model: str, messages: list[tuple[str, str]]) -> str:
        assert self.templates is not None
        return await self.templates.render(model, messages)

    def ready(self) -> bool:
        return bool(self.servicer.directory.ready)

    def servable(self) -> tuple[bool, list[str]]:
        readiness = self.servicer.readiness
        if readiness is None:
            return self.ready(), [] if self.ready() else ["(not connected to etcd yet)"]
        return readiness.check()

    def services(self) -> dict[str, str]:
        return {name: spec.model for name, spec in self.servicer.directory.services().items()}

    def submit(self, request: scheduler_pb2.SubmitRequest, who: Credentials) -> tuple[str, Follow]:
        rec = self.servicer.open_request(request, None, who.key)
        return rec.request_id, functools.partial(self.servicer.stream_into, rec)

    async def cancel(self, request_id: str) -> bool:
        return await self.servicer.cancel(request_id)
