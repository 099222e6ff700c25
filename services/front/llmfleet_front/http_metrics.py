"""``HttpMetrics``: the front's HTTP metrics as an ASGI middleware around the OpenAI app: each request by
route and status, the time to its first body byte, and the event streams being written
(``llmfleet_front_*``, :class:`llmfleet.metrics.control.FrontMetrics`).

The route is the app's path template (``/v1/completions``), ``other`` for a path no route matches, so
the labels stay few whatever clients send. A request whose handler raises before answering counts as
500 (what the framework then answers)."""

from __future__ import annotations

import time
from collections.abc import Callable

from llmfleet.metrics.control import FrontMetrics
from starlette.types import ASGIApp, Message, Receive, Scope, Send

OTHER = "other"  # the route label of a path no route matches
_EVENT_STREAM = b"text/event-stream"


def route_of(scope: Scope) -> str:
    """The path template of the route that served ``scope`` (set by the router), else :data:`OTHER`."""
    return getattr(scope.get("route"), "path", None) or OTHER


class HttpMetrics:
    """ASGI middleware (``app.add_middleware(HttpMetrics, metrics=...)``) counting into ``metrics``;
    ``clock``: monotonic seconds."""

    def __init__(self, app: ASGIApp, metrics: FrontMetrics, clock: Callable[[], float] = time.monotonic):
        self.app = app
        self.metrics = metrics
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        metrics, clock = self.metrics, self.clock
        start = clock()
        answered = False
        waiting_first_byte = True
        stream_route: str | None = None

        # Each count is made before the message that makes it true goes out, so a client that got its
        # answer (or its stream's end) and then scrapes sees it counted.
        async def send_counted(message: Message) -> None:
            nonlocal answered, waiting_first_byte, stream_route
            kind = message["type"]
            if kind == "http.response.start":
                answered = True
                route = route_of(scope)
                metrics.requests.labels(route, str(message["status"])).inc()
                if any(
                    k == b"content-type" and v.startswith(_EVENT_STREAM)
                    for k, v in message.get("headers", ())
                ):
                    stream_route = route
                    metrics.streams_open.labels(route).inc()
            elif kind == "http.response.body":
                last = not message.get("more_body", False)
                if waiting_first_byte and (message.get("body") or last):
                    waiting_first_byte = False
                    metrics.ttfb.labels(route_of(scope)).observe(clock() - start)
                if last and stream_route is not None:
                    metrics.streams_open.labels(stream_route).dec()
                    stream_route = None
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            if stream_route is not None:  # the stream ended without its last body (client gone, error)
                metrics.streams_open.labels(stream_route).dec()
            if not answered:  # the handler raised before answering: the framework answers 500
                metrics.requests.labels(route_of(scope), "500").inc()
