"""Typed exceptions for the SDK: every gRPC failure surfaces as an :class:`LlmfleetError` subclass.

The exception carries the gRPC status code and the server's details string, so callers can branch on
the type (``except NotFound``) or on ``err.code`` and show ``err.message`` to a user verbatim.
"""

from __future__ import annotations

import grpc


class LlmfleetError(Exception):
    """Base class: ``code`` is the gRPC status code, ``message`` the server's details string."""

    def __init__(self, code: grpc.StatusCode, message: str, *, request_id: str | None = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id


class InvalidArgument(LlmfleetError):
    """The request is malformed (bad sampling parameters, empty prompt ...)."""


class NotFound(LlmfleetError):
    """An unknown service, model or request id."""


class Unavailable(LlmfleetError):
    """The scheduler could not be reached (after retries) or has no capacity to serve the service."""


class DeadlineExceeded(LlmfleetError):
    """The call's deadline (``timeout_s``) passed before it completed."""


class AlreadyExists(LlmfleetError):
    """The request id was already used for a different request."""


class ResourceExhausted(LlmfleetError):
    """The cluster is overloaded or a quota was hit; retry later."""


class Unauthenticated(LlmfleetError):
    """No API key, or one the scheduler does not accept (pass ``api_key=`` or set LLMFLEET_API_KEY)."""


class PermissionDenied(LlmfleetError):
    """The API key may not use this service."""


class FailedPrecondition(LlmfleetError):
    """The system is not in a state that allows the call (e.g. the service has no placement yet)."""


class Cancelled(LlmfleetError):
    """The call was cancelled, by the client or by the server."""


class Internal(LlmfleetError):
    """A server-side bug or a broken stream (INTERNAL, UNKNOWN, DATA_LOSS)."""


_BY_CODE: dict[grpc.StatusCode, type[LlmfleetError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNKNOWN: Internal,
    grpc.StatusCode.DATA_LOSS: Internal,
}


def error_for(code: grpc.StatusCode, message: str, *, request_id: str | None = None) -> LlmfleetError:
    """The exception instance for ``code`` (the base class for codes without a dedicated subclass)."""
    return _BY_CODE.get(code, LlmfleetError)(code, message, request_id=request_id)


def from_rpc_error(
    err: grpc.RpcError, *, request_id: str | None = None, tls: bool | None = None
) -> LlmfleetError:
    """Translate a grpc (sync or aio) RpcError into the matching :class:`LlmfleetError`. ``tls``
    (whether the channel used TLS) adds a hint to the transport's terse message when a connection
    failed because the two ends disagree on TLS."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    if code == grpc.StatusCode.UNAVAILABLE and tls is not None:
        details += _tls_hint(details, tls)
    return error_for(code or grpc.StatusCode.UNKNOWN, details, request_id=request_id)


def _tls_hint(details: str, tls: bool) -> str:
    if not tls and "Socket closed" in details:
        return (
            " (the connection was closed at once: if the scheduler serves TLS, pass tls_ca= or set"
            " LLMFLEET_TLS_CA; a client certificate may be required)"
        )
    if tls and "andshake failed" in details:
        return (
            " (TLS handshake failed: the scheduler may serve plaintext, or its certificate is not"
            " signed by the CA given as tls_ca / LLMFLEET_TLS_CA)"
        )
    return ""


__all__ = [
    "Cancelled",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "LlmfleetError",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "error_for",
    "from_rpc_error",
]
