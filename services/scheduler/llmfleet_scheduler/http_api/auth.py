"""The caller of a /v1 route: the API key of its ``Authorization: Bearer`` header (a FastAPI dependency)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Header
from llmfleet.security import ApiKey, ApiKeyStore, bearer

from llmfleet_scheduler.http_api.errors import ApiError


@dataclass(frozen=True)
class Credentials:
    """Who calls: ``key``, the caller's entry in this process's key store (None: keys are off here),
    and ``token``, the bearer token as sent (the OpenAI front forwards it to the scheduler)."""

    key: ApiKey | None = None
    token: str | None = None


Caller = Callable[..., Awaitable[Credentials]]
NO_CREDENTIALS = Credentials()


def caller_dependency(key_store: ApiKeyStore | None) -> Caller:
    """The dependency: the caller's credentials; with a ``key_store``, a 401 without a valid key."""

    async def caller(authorization: str | None = Header(None)) -> Credentials:  # async: no thread hop
        if authorization is None and key_store is None:
            return NO_CREDENTIALS
        token = bearer(authorization)
        if key_store is None:
            return Credentials(None, token)
        key = key_store.authenticate(token)
        if key is None:
            msg = (
                "Missing API key: send the header 'Authorization: Bearer <key>'"
                if token is None
                else "Incorrect API key provided"
            )
            raise ApiError(401, msg, "invalid_request_error", None, "invalid_api_key",
                           {"WWW-Authenticate": "Bearer"})  # fmt: skip
        return Credentials(key, token)

    return caller
