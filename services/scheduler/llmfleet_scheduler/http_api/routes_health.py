"""Probe routes of the HTTP API: ``/health`` (connected), ``/ready`` (every service servable), ``/version``."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from llmfleet_scheduler.http_api.backend import Backend


def add_health_routes(app: FastAPI, backend: Backend, version: str) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        if backend.ready():
            return JSONResponse({"status": "serving"})
        return JSONResponse({"status": "starting"}, status_code=503)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 200 when every service that must be served has an engine with its model."""
        ok, missing = backend.servable()
        if ok:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "waiting", "unserved": missing}, status_code=503)

    @app.get("/version")
    async def get_version() -> dict[str, str]:
        return {"version": version}
