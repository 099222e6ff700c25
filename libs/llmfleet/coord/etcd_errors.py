"""The coordination library's etcd errors, and how a failed etcd call is classified: worth retrying
(:func:`is_transient`), a dead channel to replace (:func:`is_connection_failure`), or an answer from
etcd to translate (:func:`translate`: a missing lease becomes :class:`LeaseNotFound`)."""

from __future__ import annotations

import asyncio

import aetcd
import grpc

_TRANSIENT_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


class EtcdError(Exception):
    """Base class of the coordination library's etcd errors."""


class EtcdUnavailable(EtcdError):
    """etcd could not be reached (or did not answer) within the configured timeout."""


class LeaseNotFound(EtcdError):
    """The lease does not exist (expired, revoked, or etcd lost its data)."""


class WatchInterrupted(EtcdError):
    """A watch ended (compaction, server cancel, stream error); re-list and watch again."""

    def __init__(self, message: str, compact_revision: int = 0) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


def rpc_error(e: BaseException) -> grpc.aio.AioRpcError | None:
    """The gRPC error behind ``e`` (itself, or up to five causes down), None when there is none."""
    seen: BaseException | None = e
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, grpc.aio.AioRpcError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def is_transient(e: BaseException) -> bool:
    """True for errors worth retrying: connection trouble, timeouts, a channel closed under us."""
    if isinstance(e, EtcdUnavailable | ConnectionError | OSError | grpc.aio.UsageError):
        return True  # (TimeoutError is an OSError)
    if isinstance(e, aetcd.ConnectionFailedError | aetcd.ConnectionTimeoutError):
        return True
    err = rpc_error(e)
    return err is not None and err.code() in _TRANSIENT_CODES


def is_connection_failure(e: BaseException) -> bool:
    """Transport-level failure (as opposed to an etcd server answering 'etcdserver: ...')."""
    err = rpc_error(e)
    if err is None:
        return isinstance(e, ConnectionError | OSError | grpc.aio.UsageError)
    if err.code() == grpc.StatusCode.UNAVAILABLE:
        return not (err.details() or "").startswith("etcdserver:")
    return err.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN)


def describe(e: BaseException) -> str:
    """``CODE: details`` for a gRPC error, ``Type: message`` otherwise."""
    err = rpc_error(e)
    return f"{err.code().name}: {err.details()}" if err is not None else f"{type(e).__name__}: {e}"


def grpc_cancelled() -> bool:
    """True if a CancelledError did not come from cancelling the current task: grpc.aio raises
    CancelledError in the awaiting task when a call is cancelled locally (e.g. its channel closed)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


def translate(e: BaseException) -> BaseException:
    """etcd's "lease not found" as :class:`LeaseNotFound`; any other error unchanged."""
    err = rpc_error(e)
    if (
        err is not None
        and err.code() == grpc.StatusCode.NOT_FOUND
        and "lease not found" in (err.details() or "")
    ):
        return LeaseNotFound(err.details())
    return e
