"""``llmfleet load`` replay: one request through the SDK (gRPC, streaming) or the OpenAI HTTP API (the
official ``openai`` package, streaming with usage), timed on the client from the run's start; the
outcome keeps the completion's text (a conversation's next turn resends it)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from llmfleet.client import AsyncClient, LlmfleetError
from llmfleet.replay.report import LiveOutcome
from llmfleet.replay.requests import ReplayRequest

# (request, prompt) -> outcome; times are seconds from the sender's t0
Send = Callable[[ReplayRequest, str], Awaitable[LiveOutcome]]


def _outcome(req: ReplayRequest, t0: float, sent: float) -> LiveOutcome:
    return LiveOutcome(
        req.request_id, req.service, req.arrival_s, sent - t0, req.prompt_tokens, req.max_tokens
    )


def sdk_sender(client: AsyncClient, t0: float) -> Send:
    """Send through ``client`` (``AsyncClient``): first token = the first chunk with tokens; the
    engine's own TTFT from the final usage."""

    async def send(req: ReplayRequest, prompt: str) -> LiveOutcome:
        sent = time.monotonic()
        out = _outcome(req, t0, sent)
        texts: list[str] = []
        try:
            stream = client.generate(prompt, req.service, max_tokens=req.max_tokens, session=req.session)
            async with stream:
                async for chunk in stream:
                    if out.first_token_s is None and chunk.token_ids:
                        out.first_token_s = time.monotonic() - t0
                    texts.append(chunk.text)
        except LlmfleetError as e:
            out.error = f"{e.code.name}: {e.message}"
            return out
        u = stream.usage
        if u is None:
            out.error = "the stream ended without usage"
            return out
        out.finish_s = time.monotonic() - t0
        out.text = "".join(texts)
        out.completion_tokens = u.completion_tokens
        out.engine_id = u.engine_id
        out.finish_reason = u.finish_reason
        out.engine_ttft_s = u.engine_ttft_s or None  # 0: the scheduler does not know it
        out.scheduler_ttft_s, out.scheduler_queue_s = u.ttft_s, u.queue_s
        out.cached_tokens = u.cached_tokens
        return out

    return send


def http_sender(client: Any, t0: float) -> Send:
    """Send through ``client`` (``openai.AsyncOpenAI``): a streamed completion (``model`` = the service)
    with usage, its conversation in the request body's ``session``; the HTTP API does not say which
    engine served it."""
    import openai

    async def send(req: ReplayRequest, prompt: str) -> LiveOutcome:
        sent = time.monotonic()
        out = _outcome(req, t0, sent)
        texts: list[str] = []
        try:
            stream = await client.completions.create(
                model=req.service,
                prompt=prompt,
                max_tokens=req.max_tokens,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"session": req.session} if req.session else None,
            )
            async for chunk in stream:
                for choice in chunk.choices or ():
                    if out.first_token_s is None and choice.text:
                        out.first_token_s = time.monotonic() - t0
                    texts.append(choice.text)
                    if choice.finish_reason:
                        out.finish_reason = choice.finish_reason
                if chunk.usage is not None:
                    out.completion_tokens = chunk.usage.completion_tokens
                    details = chunk.usage.prompt_tokens_details
                    out.cached_tokens = details.cached_tokens if details is not None else None
        except openai.APIStatusError as e:
            out.error = f"HTTP {e.status_code}: {e.message}"
            return out
        except openai.APIError as e:
            out.error = f"{type(e).__name__}: {e.message}"
            return out
        out.finish_s = time.monotonic() - t0
        out.text = "".join(texts)
        return out

    return send
