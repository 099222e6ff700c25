"""OpenAI-compatible request bodies (pydantic) and the response/chunk dicts of the HTTP API.

Only the fields llmfleet can honour are modelled; other OpenAI fields (``user``, penalties, ...)
are accepted and ignored, so stock clients work unchanged."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llmfleet_scheduler.validation import MAX_ID_CHARS


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


MAX_TOKENS = 2**31 - 1  # SamplingParams.max_tokens is an int32
MAX_SEED = 2**64 - 1  # SamplingParams.seed is a uint64


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    # bounded to the protobuf field's range (beyond it the request was a 500); the model's context is
    # checked with the gRPC path's messages
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = Field(None, le=MAX_SEED)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # llmfleet's extension: the conversation the request continues (clients send it in extra_body);
    # a dispatch policy that keeps conversations together sends its turns where the last one ran
    session: str = Field("", max_length=MAX_ID_CHARS)
    # the request's priority, as vLLM accepts it (an integer; llmfleet: higher first, negative
    # sheddable); its range and the API key's allowance are checked with the gRPC path's messages
    priority: int | None = Field(None, strict=True, ge=-(2**31), le=2**31 - 1)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def token_limit(self) -> int | None:
        return self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str]

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def now() -> int:
    return int(time.time())


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage object; ``cached_tokens``: prompt tokens the engines found in their prefix caches."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
