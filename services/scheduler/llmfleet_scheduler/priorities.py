"""Each live request's class, as the capacity gate orders and sheds it: its priority, its API key (the
tenant that fair queueing counts tokens for) and the output tokens it is charged for when it leaves
the hold queue. The servicer adds a request's class when it starts it and ends it when its driver
ends (then the charge is settled with the tokens it generated); the gate reads it by request id.
Also the per-key, per-priority metrics (``llmfleet_scheduler_key_*``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llmfleet.metrics.control import SchedulerMetrics


@dataclass
class RequestClass:
    priority: int
    key: str = ""  # the API key's name ("" with keys off): the tenant
    output_tokens: int = 0  # its max_tokens: the output charged when it leaves the hold queue
    # set when the gate charged it: given the output tokens generated, corrects the charge
    settle: Callable[[int], None] | None = None


@dataclass
class RequestClasses:
    metrics: SchedulerMetrics
    _live: dict[str, RequestClass] = field(default_factory=dict)

    def add(self, request_id: str, cls: RequestClass) -> None:
        self._live[request_id] = cls
        self.count(cls, "admitted")

    def get(self, request_id: str) -> RequestClass | None:
        return self._live.get(request_id)

    def end(self, request_id: str, generated: int) -> None:
        """The request ended having generated ``generated`` tokens: its charge is settled."""
        cls = self._live.pop(request_id, None)
        if cls is not None and cls.settle is not None:
            cls.settle(generated)

    def count(self, cls: RequestClass, outcome: str) -> None:
        """``outcome``: admitted, refused or shed."""
        self.metrics.key_requests.labels(cls.key, str(cls.priority), outcome).inc()

    def waited(self, cls: RequestClass, seconds: float) -> None:
        self.metrics.key_wait_seconds.labels(cls.key, str(cls.priority)).observe(seconds)
