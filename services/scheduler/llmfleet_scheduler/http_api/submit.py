"""Submit one HTTP call's requests: each prompt ``n`` times (choice ``i`` samples with ``seed + i``),
through the backend's submit path; a refusal cancels the ones already started."""

from __future__ import annotations

import contextlib
import uuid

from llmfleet.api.v1 import common_pb2, scheduler_pb2

from llmfleet_scheduler.http_api.auth import Credentials
from llmfleet_scheduler.http_api.backend import Backend
from llmfleet_scheduler.http_api.errors import ApiError, from_exc
from llmfleet_scheduler.http_api.routes_models import ModelCatalog
from llmfleet_scheduler.http_api.streaming import Choice
from llmfleet_scheduler.journal import RequestFailed
from llmfleet_scheduler.openai_protocol import MAX_SEED, ChatCompletionRequest, CompletionRequest
from llmfleet_scheduler.validation import InvalidField

Body = CompletionRequest | ChatCompletionRequest


def _check_seed(body: Body) -> None:
    if body.seed is not None and body.seed < 0:
        raise ApiError(400, f"seed: must be >= 0, got {body.seed}", "invalid_request_error", "seed")
    if body.seed is not None and body.seed + body.n - 1 > MAX_SEED:  # choice i samples with seed + i
        raise ApiError(
            400,
            f"seed: must be at most {MAX_SEED - body.n + 1} with n={body.n}",
            "invalid_request_error",
            "seed",
        )


def _sampling(body: Body, i: int) -> common_pb2.SamplingParams:
    """The sampling parameters of choice ``i``."""
    s = common_pb2.SamplingParams(stop=body.stop_list())
    if body.token_limit() is not None:
        s.max_tokens = body.token_limit()
    if body.temperature is not None:
        s.temperature = body.temperature
    if body.top_p is not None:
        s.top_p = body.top_p
    if body.seed is not None:
        s.seed = body.seed + i
    return s


async def start(
    backend: Backend, catalog: ModelCatalog, body: Body, prompts: list[str], param: str, who: Credentials
) -> list[Choice]:
    """The choices of ``prompts`` x ``body.n`` requests to the service ``body.model`` names; ``param``:
    what the request calls its prompt (for error messages); ``who``: the caller."""
    service = catalog.resolve(body.model, who.key)
    _check_seed(body)
    choices: list[Choice] = []
    try:
        for prompt in prompts:
            for i in range(body.n):
                req = scheduler_pb2.SubmitRequest(
                    request_id=uuid.uuid4().hex,
                    service=service,
                    prompt=prompt,
                    sampling=_sampling(body, i),
                    session=body.session,
                    priority=body.priority,
                )
                rid, follow = backend.submit(req, who)
                choices.append(Choice(len(choices), rid, follow, count_prompt=i == 0))
    except (InvalidField, RequestFailed) as e:
        for c in choices:
            with contextlib.suppress(Exception):
                await backend.cancel(c.request_id)
        raise from_exc(e, param) from e
    return choices
