"""The caller of a /v1 route: the API key of its ``Authorization: Bearer`` header (a FastAPI dependency)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Header
from llmfleet.security import ApiKey, ApiKeyStore, bearer

from llmfleet_scheduler.http_api.errors import ApiError

Caller = Callable[..., Awaitable["ApiKey | None"]]


def caller_dependency(key_store: ApiKeyStore | None) -> Caller:
    """The dependency: None without a ``key_store``; else the caller's key, or a 401 without a valid one."""

    async def caller(authorization: str | None = Header(None)) -> ApiKey | None:  # async: no thread hop
        if key_store is None:
            return None
        token = bearer(authorization)
        key = key_store.authenticate(token)
        if key is None:
            msg = (
                "Missing API key: send the header 'Authorization: Bearer <key>'"
                if token is None
                else "Incorrect API key provided"
            )
            raise ApiError(401, msg, "invalid_request_error", None, "invalid_api_key",
                           {"WWW-Authenticate": "Bearer"})  # fmt: skip
        return key

    return caller
