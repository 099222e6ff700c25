"""What the HTTP API needs from the scheduler (``Backend``) and the real one (``ServicerBackend``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from llmfleet.api.v1 import common_pb2, scheduler_pb2
from llmfleet.security import ApiKey

from llmfleet_scheduler.chat_template import ChatTemplates


class Backend(Protocol):
    """What the HTTP layer needs from the scheduler (a fake in unit tests)."""

    def ready(self) -> bool: ...

    def servable(self) -> tuple[bool, list[str]]:
        """Whether every service that must be served has an engine (and which have none)."""
        ...

    def services(self) -> dict[str, str]:
        """service name -> model name"""
        ...

    def submit(
        self, request: scheduler_pb2.SubmitRequest, key: ApiKey | None = None
    ) -> tuple[str, AsyncIterator[common_pb2.TokenChunk]]:
        """Start (or attach to) a request for the caller's ``key``: its id and its chunks, the last one
        final. Raises InvalidField or RequestFailed before streaming; the iterator raises RequestFailed."""
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

    def submit(
        self, request: scheduler_pb2.SubmitRequest, key: ApiKey | None = None
    ) -> tuple[str, AsyncIterator[common_pb2.TokenChunk]]:
        rec = self.servicer.open_request(request, None, key)
        return rec.request_id, self.servicer.follow(rec)

    async def cancel(self, request_id: str) -> bool:
        return await self.servicer.cancel(request_id)
