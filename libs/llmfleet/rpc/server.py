"""A grpc.aio server with grpc.health.v1, server reflection, tracing interceptors, and TLS / API keys
from the process's security settings (health and reflection stay open)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from llmfleet.rpc.channels import CHANNEL_OPTIONS
from llmfleet.rpc.details import ClipDetailsInterceptor
from llmfleet.security import SecuritySettings, current
from llmfleet.security.grpc_auth import ApiKeyServerInterceptor
from llmfleet.security.tls import server_credentials
from llmfleet.telemetry import server_interceptors

log = logging.getLogger(__name__)

# (add_XServicer_to_server, servicer instance, full service name from the pb2 DESCRIPTOR)
Registration = tuple[Callable[[Any, grpc.aio.Server], None], Any, str]


@dataclass
class GrpcServer:
    """Owns one grpc.aio server. ``port=0`` picks a free port (see ``.port`` after ``start``)."""

    services: Sequence[Registration]
    host: str = "127.0.0.1"
    port: int = 0
    health: health_aio.HealthServicer = field(default_factory=health_aio.HealthServicer)
    # service names whose health starts NOT_SERVING (a readiness signal the service sets itself)
    gated: frozenset[str] = frozenset()
    security: SecuritySettings | None = None  # None: the process's settings (llmfleet.security.current)
    _server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> GrpcServer:
        sec = self.security or current()
        interceptors = [ClipDetailsInterceptor(), *server_interceptors()]
        if sec.key_store is not None:
            interceptors = [*interceptors, ApiKeyServerInterceptor(sec.key_store)]
        server = grpc.aio.server(interceptors=interceptors, options=CHANNEL_OPTIONS)
        names = [reflection.SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name]
        for add, servicer, name in self.services:
            add(servicer, server)
            names.append(name)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(names, server)
        creds = server_credentials(sec)
        target = f"{self.host}:{self.port}"
        bound = server.add_insecure_port(target) if creds is None else server.add_secure_port(target, creds)
        if bound == 0:
            raise OSError(f"cannot bind gRPC server to {self.host}:{self.port}")
        self.port = bound
        await server.start()
        self._server = server
        for _, _, name in self.services:
            serving = name not in self.gated
            await self.set_service_serving(name, serving)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "gRPC server on %s (%s%s) serving %s",
            self.address,
            "mutual TLS" if sec.tls_client_auth else "TLS" if creds else "plaintext",
            ", API keys" if sec.key_store is not None else "",
            [n for *_, n in self.services],
        )
        return self

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for _, _, name in self.services:
            await self.health.set(name, status)
        await self.health.set("", status)

    async def set_service_serving(self, name: str, serving: bool) -> None:
        """The health of one service name only (a readiness signal; ``""`` stays liveness)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set(name, status)

    async def stop(self, grace: float = 2.0) -> None:
        if self._server is None:
            return
        await self.health.enter_graceful_shutdown()
        await self._server.stop(grace)
        self._server = None

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


def service_name(pb2_module: Any, service: str) -> str:
    """Full name of ``service`` in a generated ``*_pb2`` module, e.g. ``llmfleet.v1.Engine``."""
    return pb2_module.DESCRIPTOR.services_by_name[service].full_name
