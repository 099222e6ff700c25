"""OpenAI-shaped errors: ``ApiError``, scheduler failures mapped to HTTP statuses (``from_exc``), and
the app's exception handlers (validation, framework and API errors all answer in OpenAI's shape)."""

from __future__ import annotations

import json
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmfleet_scheduler.journal import RequestFailed
from llmfleet_scheduler.openai_protocol import error_body
from llmfleet_scheduler.validation import InvalidField

# SubmitRequest field (validation.py) -> OpenAI request field
_PARAM = {
    "service": "model",
    "sampling.max_tokens": "max_tokens",
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.stop": "stop",
    "sampling.seed": "seed",
}
_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", None),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "invalid_request_error", "conflict"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "overloaded"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "invalid_request_error", "invalid_api_key"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error", "model_not_allowed"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable", "no_engine"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout", "deadline_exceeded"),
    grpc.StatusCode.CANCELLED: (499, "cancelled", "cancelled"),
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(
            error_body(self.message, self.type, self.param, self.code),
            status_code=self.status,
            headers=self.headers,
        )

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def from_exc(exc: BaseException, prompt_param: str) -> ApiError:
    """``exc`` as an OpenAI error; ``prompt_param``: what the request calls its prompt."""
    if isinstance(exc, InvalidField):
        param = (
            "messages"
            if exc.field == "prompt" and prompt_param == "messages"
            else _PARAM.get(exc.field, exc.field)
        )
        msg = str(exc).replace(exc.field, param, 1)
        return ApiError(400, msg, "invalid_request_error", param, "invalid_value")
    if isinstance(exc, RequestFailed):
        status, type_, code = _STATUS.get(exc.code, (500, "internal_error", None))
        param = (
            "model" if exc.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED) else None
        )
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
        return ApiError(status, exc.details, type_, param, code, headers)
    if isinstance(exc, ApiError):
        return exc
    return ApiError(500, f"internal error: {exc!r}", "internal_error")


async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
    err = exc.errors()[0] if exc.errors() else {}
    if err.get("type") == "json_invalid":  # its loc is a byte offset, not a parameter
        where = (err.get("ctx") or {}).get("error", "")
        msg = f"request body: not valid JSON ({where})" if where else "request body: not valid JSON"
        return ApiError(400, msg, "invalid_request_error", None, "invalid_json").response()
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    msg = f"{param or 'request body'}: {err.get('msg', 'invalid request')}"
    return ApiError(400, msg, "invalid_request_error", param, "invalid_value").response()


async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The framework's own errors (unparseable body, unknown route, wrong method) in OpenAI's shape."""
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    if exc.status_code == 400:
        detail = f"request body: {detail}"
    type_ = "invalid_request_error" if exc.status_code < 500 else "internal_error"
    return ApiError(exc.status_code, detail, type_, None, None, exc.headers).response()


async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
    return exc.response()


def install_error_handlers(app: FastAPI) -> None:
    # Starlette types a handler as taking any Exception; each of these takes the class it is added for
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
