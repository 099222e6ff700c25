"""The executor's request table: its active requests and the one lock that guards them.

One table is shared by reference between the executor (submit, cancel, the worker) and its parts (the
model host, the migration ops, the load report): the requests, the engine core and the KV pool are
read and written under ``cond`` only. Parts retire a request through the executor's :class:`Retire`
(the final chunk, the core's bookkeeping and the metrics are the executor's).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from llmfleet_engine.outputs import ExecutorClosedError, FinishReason, RequestNotFoundError

if TYPE_CHECKING:
    from llmfleet_engine.live_request import LiveRequest


class Retire(Protocol):
    """End an active request here (called under the table's lock): out of the core, final chunk sent."""

    def __call__(self, state: LiveRequest, reason: FinishReason, *, migrated_to: str = "") -> None: ...


@dataclass(eq=False)
class RequestTable:
    """Active requests by id, the lock (a condition: the worker waits on it) and the executor's state
    read with them."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    requests: dict[str, LiveRequest] = field(default_factory=dict)
    prefilling: frozenset[str] | set[str] = frozenset()  # prefills of the step in flight
    closed: bool = False

    def check_open(self) -> None:
        if self.closed:
            raise ExecutorClosedError("executor is closed")

    def active(self, request_id: str) -> LiveRequest:
        """The active request ``request_id`` (RequestNotFoundError if it is unknown or finished)."""
        r = self.requests.get(request_id)
        if r is None or r.finished:
            raise RequestNotFoundError(f"no active request {request_id!r} on this engine")
        return r
