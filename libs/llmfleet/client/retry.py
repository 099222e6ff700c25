"""When the SDK retries a call: :class:`Backoff` (UNAVAILABLE with exponential backoff on the next
scheduler replica, an overload after the server's retry pushback, never past the deadline), which
errors count as retryable (:func:`pushback_s`, :func:`unaccepted`) and the time left
(:func:`remaining`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from llmfleet.client.errors import DeadlineExceeded

# the SDK's retry warnings keep the logger name of llmfleet.client.aio, which tools and users filter on
log = logging.getLogger("llmfleet.client.aio")

UNACCEPTED_S = 30  # grpc core cancels a call its server has not taken up in this long
CORE_CANCEL = ("CANCELLED", "Cancelled", "")  # the details of a cancel by gRPC core, not by an application


def is_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE


def unaccepted(exc: grpc.aio.AioRpcError, received: bool) -> grpc.aio.AioRpcError:
    """A Submit ended CANCELLED by gRPC core itself (no application message) before the server sent
    anything is a call the server never took up: core cancels calls left unaccepted for 30 s, which
    happens when the scheduler's event loop is saturated. Nothing ran, so it is retried (on the next
    replica) as UNAVAILABLE. A cancel with a message (a scheduler shutting down) stays final."""
    if exc.code() != grpc.StatusCode.CANCELLED or received or exc.details() not in CORE_CANCEL:
        return exc
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        exc.trailing_metadata() or grpc.aio.Metadata(),
        f"the scheduler did not take the call up ({exc.details()}; gRPC cancels calls its server has not "
        f"accepted in {UNACCEPTED_S} s: the scheduler is saturated)",
    )


def pushback_s(exc: BaseException) -> float | None:
    """The server's retry pushback (``grpc-retry-pushback-ms``, sent with RESOURCE_EXHAUSTED when a
    service is overloaded) in seconds; None when there is none (the error is then final)."""
    if not isinstance(exc, grpc.aio.AioRpcError) or exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for k, v in exc.trailing_metadata() or ():
        if k == "grpc-retry-pushback-ms":
            try:
                return max(0.0, int(v) / 1000)
            except ValueError:
                return None
    return None


def remaining(deadline: float | None, request_id: str | None = None) -> float | None:
    """Seconds left until ``deadline`` (None: no deadline); DeadlineExceeded once it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", request_id=request_id)
    return left


@dataclass
class Backoff:
    """The retry schedule of one call: after the n-th failed attempt, UNAVAILABLE is retried in
    ``min(max_backoff_s, backoff_s * 2**(n-1))`` seconds and an overload (RESOURCE_EXHAUSTED with a
    retry pushback) after the pushback the server asked for, at most ``retries`` times in all and never
    past the deadline; any other error is final. (A plain loop: building a tenacity retrier per call cost about
    0.1 ms of the client's CPU per request.)

    ``failover(address)`` moves the client off a replica found unavailable; ``current()`` is the
    replica calls go to now."""

    retries: int
    backoff_s: float
    max_backoff_s: float
    failover: Callable[[str], Awaitable[None]]
    current: Callable[[], str]
    deadline: float | None
    what: str
    failures: int = 0

    async def again(self, exc: BaseException, address: str | None = None) -> bool:
        """After a failed attempt: True once the wait before the next one is over, False to give up."""
        self.failures += 1
        pushback = pushback_s(exc)
        if not (is_unavailable(exc) or pushback is not None) or self.failures > self.retries:
            return False
        sleep = (
            pushback
            if pushback is not None
            else min(self.max_backoff_s, self.backoff_s * 2 ** (self.failures - 1))
        )
        if self.deadline is not None and time.monotonic() + sleep >= self.deadline:
            return False
        detail = exc.details() if isinstance(exc, grpc.RpcError) else exc
        failed = address or self.current()
        if pushback is None:
            await self.failover(failed)  # unavailable: the next scheduler replica (when there are several)
        log.warning(
            "%s: scheduler at %s %s (%s); retry %d/%d on %s in %.2fs",
            self.what,
            failed,
            "overloaded" if pushback is not None else "unavailable",
            detail,
            self.failures,
            self.retries,
            self.current(),
            sleep,
        )
        await asyncio.sleep(sleep)
        return True
