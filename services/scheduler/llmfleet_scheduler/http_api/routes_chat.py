"""``POST /v1/chat/completions``: chat messages rendered with the model's chat template, then completed."""

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
from llmfleet_scheduler.openai_protocol import ChatCompletionRequest


class ChatShape(ResponseShape):
    """A ``chat.completion`` response, streamed as ``chat.completion.chunk`` deltas."""

    id_prefix = "chatcmpl"

    def head(self, final: bool) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion" if final else "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }

    def piece_content(self, text: str, new: bool, closing: bool) -> dict[str, Any]:
        delta: dict[str, Any] = {} if closing else {"content": text}
        if new:
            delta["role"] = "assistant"
        return {"delta": delta}

    def final_content(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text, "refusal": None}}


async def _render(backend: Backend, model: str, body: ChatCompletionRequest) -> str:
    """The prompt of ``body``'s messages (a 400 when the model's template refuses them)."""
    try:
        return await backend.render_chat(model, [(m.role, m.text()) for m in body.messages])
    except Exception as e:  # the model's template refuses these messages (e.g. roles out of order)
        raise ApiError(
            400, f"messages: the chat template of {model!r} refused them: {e}", "invalid_request_error",
            "messages", "invalid_value",
        ) from e  # fmt: skip


def add_chat_routes(app: FastAPI, backend: Backend, catalog: ModelCatalog, caller: Caller) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(
        request: Request, body: ChatCompletionRequest, who: Credentials = Depends(caller)
    ) -> Response:
        model = backend.services()[catalog.resolve(body.model, who.key)]
        prompt = await _render(backend, model, body)
        choices = await start(backend, catalog, body, [prompt], "messages", who)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await respond(
            request, backend, choices, body.stream, "messages", ChatShape(body.model, include_usage)
        )
