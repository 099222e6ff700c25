"""``HttpMetrics`` on its own: a handler that raises before answering counts once, as 500."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from llmfleet.metrics.control import FrontMetrics
from llmfleet.metrics.server import samples
from llmfleet_front.http_metrics import HttpMetrics
from prometheus_client import CollectorRegistry


async def test_a_handler_that_raises_counts_once_as_500() -> None:
    registry = CollectorRegistry()
    app = FastAPI()

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("boom")

    app.add_middleware(HttpMetrics, metrics=FrontMetrics(registry))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://front") as http:
        assert (await http.get("/boom")).status_code == 500
    counted = {k: v for k, v in samples(registry).items() if k.startswith("llmfleet_front_requests_total")}
    assert counted == {'llmfleet_front_requests_total{route="/boom",status="500"}': 1.0}
