"""OpenAI-compatible HTTP API of the scheduler (FastAPI, served by uvicorn in the scheduler's loop).

Every completion goes through the same entry point as the gRPC ``Submit`` (``Backend.submit`` ->
``SchedulerServicer.open_request``: validation, journal, dispatch, failover); ``n`` choices are
``n`` independent requests (with a seed: seed, seed+1, ...). A client that disconnects cancels its
requests through the journal's cancel path (as the ``Cancel`` RPC).

Parts: ``backend`` (what the API needs from the scheduler), ``auth`` (API keys), ``errors`` (OpenAI's
error shape), ``submit`` + ``streaming`` (the one path every completion route takes), the route
modules ``routes_health``, ``routes_models``, ``routes_completions``, ``routes_chat``, and ``server``."""

from __future__ import annotations

from fastapi import FastAPI
from llmfleet.security import ApiKeyStore

from llmfleet_scheduler.http_api.auth import Credentials, caller_dependency
from llmfleet_scheduler.http_api.backend import Backend, Follow, ServicerBackend
from llmfleet_scheduler.http_api.errors import ApiError, install_error_handlers
from llmfleet_scheduler.http_api.routes_chat import add_chat_routes
from llmfleet_scheduler.http_api.routes_completions import add_completion_routes
from llmfleet_scheduler.http_api.routes_health import add_health_routes
from llmfleet_scheduler.http_api.routes_models import ModelCatalog, add_model_routes
from llmfleet_scheduler.http_api.server import HttpServer


def create_app(backend: Backend, version: str = "", key_store: ApiKeyStore | None = None) -> FastAPI:
    """The app; with ``key_store`` every /v1 route needs ``Authorization: Bearer <key>`` (401 without
    a valid one; a key limited to some services sees and may use only those: 403 otherwise)."""
    app = FastAPI(title="llmfleet OpenAI-compatible API", version=version or "0")
    install_error_handlers(app)
    caller = caller_dependency(key_store)
    catalog = ModelCatalog(backend)
    add_health_routes(app, backend, version)
    add_model_routes(app, catalog, caller)
    add_completion_routes(app, backend, catalog, caller)
    add_chat_routes(app, backend, catalog, caller)
    return app


__all__ = ["ApiError", "Backend", "Credentials", "Follow", "HttpServer", "ServicerBackend", "create_app"]
