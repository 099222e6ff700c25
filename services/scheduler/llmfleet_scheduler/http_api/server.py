"""``HttpServer``: uvicorn serving the HTTP API inside the scheduler's running event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from llmfleet.security import SecuritySettings
from llmfleet.security.tls import uvicorn_ssl

log = logging.getLogger(__name__)


@dataclass
class HttpServer:
    """uvicorn serving the app inside the running event loop; ``port`` 0 picks a free port."""

    app: FastAPI
    host: str
    port: int
    security: SecuritySettings | None = None  # TLS: HTTPS with the gRPC server's certificate
    # SO_REUSEPORT: several processes serve one port, the kernel spreading connections over them
    reuse_port: bool = False
    _server: Any = None
    _task: asyncio.Task | None = None

    async def start(self) -> None:
        import socket

        import uvicorn

        # Bind here, not in uvicorn: its bind failure is sys.exit(1), which would end the scheduler.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets it knows are TCP (else the first
        # SSE event of each response waits ~40 ms for the client's delayed ACK)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            log.error("OpenAI-compatible API disabled: cannot bind %s:%d: %s", self.host, self.port, e)
            return
        sock.set_inheritable(True)
        self.port = sock.getsockname()[1]
        ssl_kwargs = uvicorn_ssl(self.security) if self.security is not None else {}
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=1,
            **ssl_kwargs,
        )
        self._server = uvicorn.Server(config)
        self._server.capture_signals = contextlib.nullcontext  # the service owns SIGINT/SIGTERM
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="scheduler-http")
        log.info("OpenAI-compatible API on %s", self.url)

    @property
    def url(self) -> str:
        scheme = "https" if self.security is not None and self.security.server_tls else "http"
        return f"{scheme}://{self.host}:{self.port}/v1"

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError, Exception):
            await asyncio.wait_for(self._task, 5)
