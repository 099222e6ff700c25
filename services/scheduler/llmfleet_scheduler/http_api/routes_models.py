"""Model ids of the HTTP API: ``/v1/models``, and the service a request's ``model`` names (``ModelCatalog``).

A model id is a service name, or a model name (meaning its first service, by name); an API key
limited to some services sees and may use only those."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI
from llmfleet.security import ApiKey

from llmfleet_scheduler.http_api.auth import Caller, Credentials
from llmfleet_scheduler.http_api.backend import Backend
from llmfleet_scheduler.http_api.errors import ApiError
from llmfleet_scheduler.openai_protocol import now


@dataclass
class ModelCatalog:
    backend: Backend

    def ids(self, key: ApiKey | None = None) -> dict[str, str]:
        """model id -> service: every service ``key`` may use, plus each model name (its first such
        service, by name)."""
        services = {n: m for n, m in self.backend.services().items() if key is None or key.allows(n)}
        ids = {name: name for name in sorted(services)}
        for name in sorted(services):
            ids.setdefault(services[name], name)
        return ids

    def resolve(self, model: str, key: ApiKey | None) -> str:
        """The service ``model`` names for ``key`` (ApiError 403/404/503 when none)."""
        service = self.ids().get(model)
        if service is not None and key is not None and not key.allows(service):
            raise ApiError(
                403,
                f"model: API key {key.name!r} may not use {model!r}",
                "permission_error",
                "model",
                "model_not_allowed",
            )
        if service is None:
            if not self.backend.ready():
                raise ApiError(503, "scheduler is not connected to etcd yet; retry", "service_unavailable")
            known = ", ".join(self.ids()) or "none"
            raise ApiError(
                404,
                f"The model {model!r} does not exist (known: {known})",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        return service


def add_model_routes(app: FastAPI, catalog: ModelCatalog, caller: Caller) -> None:
    @app.get("/v1/models")
    async def list_models(who: Credentials = Depends(caller)) -> dict[str, Any]:
        created = now()
        data = [
            {"id": i, "object": "model", "created": created, "owned_by": "llmfleet"}
            for i in catalog.ids(who.key)
        ]
        return {"object": "list", "data": data}
