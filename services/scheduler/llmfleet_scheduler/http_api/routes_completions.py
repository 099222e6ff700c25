"""``POST /v1/completions``: text completions of one or more prompts."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from llmfleet_scheduler.http_api.auth import Caller, Credentials
from llmfleet_scheduler.http_api.backend import Backend
from llmfleet_scheduler.http_api.errors import ApiError
from llmfleet_scheduler.http_api.routes_models import ModelCatalog
from llmfleet_scheduler.http_api.streaming import ResponseShape, respond
from llmfleet_scheduler.http_api.submit import start
from llmfleet_scheduler.openai_protocol import CompletionRequest


class CompletionShape(ResponseShape):
    """A ``text_completion`` response (streamed chunks have the same object name)."""

    id_prefix = "cmpl"

    def head(self, final: bool) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}

    def piece_content(self, text: str, new: bool, closing: bool) -> dict[str, Any]:
        return {"text": text}

    def final_content(self, text: str) -> dict[str, Any]:
        return {"text": text}


def add_completion_routes(app: FastAPI, backend: Backend, catalog: ModelCatalog, caller: Caller) -> None:
    @app.post("/v1/completions")
    async def completions(
        request: Request, body: CompletionRequest, who: Credentials = Depends(caller)
    ) -> Response:
        if not body.prompts() or any(not p for p in body.prompts()):
            raise ApiError(
                400, "prompt: must not be empty", "invalid_request_error", "prompt", "invalid_value"
            )
        choices = await start(backend, catalog, body, body.prompts(), "prompt", who)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await respond(
            request, backend, choices, body.stream, "prompt", CompletionShape(body.model, include_usage)
        )
