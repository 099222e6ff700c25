"""The shell every service process shares: gRPC server up first, then etcd in the background.

A service answers health as soon as it starts, even while etcd is unreachable: connecting, leasing
and registering ``nodes/{id}`` happen in a background task that retries with backoff and logs, so an
etcd outage degrades a service instead of killing it. ``on_etcd`` hooks run once etcd is reached
(views, elections, watches).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from llmfleet.config import EtcdSettings
from llmfleet.coord import EtcdClient, Registration
from llmfleet.metrics.control import shell_metrics
from llmfleet.metrics.server import MetricsServer, metrics_port, start_metrics_server
from llmfleet.rpc.cli_args import setup_logging
from llmfleet.rpc.server import GrpcServer
from llmfleet.security import SecurityConfigError, configure, settings_from_args
from llmfleet.security.api_keys import ApiKeyError
from llmfleet.telemetry import setup_tracing
from llmfleet.types import NodeRecord

log = logging.getLogger(__name__)

EtcdHook = Callable[["ServiceNode"], Awaitable[None]]


@dataclass
class ServiceNode:
    role: str
    node_id: str
    settings: EtcdSettings
    server: GrpcServer
    advertise: str | None = None
    describe: Callable[[NodeRecord], NodeRecord] | None = None  # enrich the record (engine: models, memory)
    on_etcd: list[EtcdHook] = field(default_factory=list)
    # Spawned right after the server starts, whether or not etcd is reachable (e.g. preloading models).
    on_start: list[EtcdHook] = field(default_factory=list)
    # Run at shutdown after spawned tasks are cancelled, before the lease is revoked (resign, stop views).
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    etcd: EtcdClient | None = None  # set by start()
    registration: Registration | None = None  # set once etcd is reached
    etcd_ready: asyncio.Event = field(default_factory=asyncio.Event)
    # /metrics: the port (-1 disabled, 0 any free; set by run_service from --metrics-port) and the host
    metrics_port: int = -1
    metrics_host: str = "127.0.0.1"
    metrics: MetricsServer | None = None  # set by start() when metrics_port != -1
    metrics_registry: CollectorRegistry | None = None  # what /metrics serves (None: the process's)
    owns_etcd: bool = True  # False: ``etcd`` was handed in, shared with other nodes of the process
    shared_etcd_ready: asyncio.Event | None = None  # set once a shared ``etcd`` is connected
    _started_at: float = field(default_factory=time.time)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.advertise or self.server.address

    def record(self) -> NodeRecord:
        base = NodeRecord(
            node_id=self.node_id,
            role=self.role,
            address=self.address,
            pid=os.getpid(),
            started_at=self._started_at,
        )
        return self.describe(base) if self.describe else base

    async def start(self) -> None:
        await self.server.start()
        self.start_metrics()
        for hook in self.on_start:
            self.spawn(self._guarded(hook), f"{self.role}-start-{getattr(hook, '__name__', 'hook')}")
        if self.etcd is None:
            self.etcd = EtcdClient(self.settings)
        else:
            self.owns_etcd = False
        self._tasks.append(asyncio.create_task(self._attach(), name=f"{self.role}-etcd-attach"))

    def start_metrics(self) -> MetricsServer | None:
        """Serve ``/metrics`` (the process registry) unless ``metrics_port`` is -1; logs the address."""
        if self.metrics is None and self.metrics_port != -1:
            try:
                self.metrics = start_metrics_server(
                    self.metrics_port, self.metrics_host, self.metrics_registry
                )
            except OSError as e:  # the port is taken: metrics on any free port, the service serves on
                log.error("%s %s: cannot serve /metrics on port %d (%s); using a free port", self.role,
                          self.node_id, self.metrics_port, e)  # fmt: skip
                self.metrics = start_metrics_server(0, self.metrics_host, self.metrics_registry)
            if self.metrics is not None:
                log.info("%s %s metrics on %s", self.role, self.node_id, self.metrics.url)
        return self.metrics

    async def _attach(self) -> None:
        assert self.etcd is not None
        if self.owns_etcd:
            await self.etcd.connect(wait=True)  # retries forever, logging each failure
        elif self.shared_etcd_ready is not None:
            await self.shared_etcd_ready.wait()  # the process's shared client is connected once
        key = self.etcd.keys.node(self.node_id)
        self.registration = Registration(
            self.etcd, key, lambda: self.record().to_json(), self.settings.lease_ttl_s
        )
        losses = shell_metrics().lease_losses.labels(self.role)
        self.registration.on_lost = losses.inc
        await self.registration.start()
        self.etcd_ready.set()
        log.info(
            "%s %s reached etcd %s; registering %s", self.role, self.node_id, self.settings.endpoints, key
        )
        for hook in self.on_etcd:
            await self._guarded(hook)

    async def _guarded(self, hook: EtcdHook) -> None:
        try:
            await hook(self)
        except Exception:  # a hook failing must not take the process down
            log.exception("%s: hook %s failed", self.node_id, getattr(hook, "__name__", hook))

    async def update_record(self) -> None:
        """Re-publish ``nodes/{id}`` (e.g. after the engine's model set changed)."""
        if self.registration is not None:
            await self.registration.update()

    def spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.append(task)
        return task

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.server.set_serving(False)
        for t in reversed(self._tasks):
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for hook in self.on_stop:
            try:
                await hook()
            except Exception:
                log.exception("%s: shutdown hook failed", self.node_id)
        if self.registration is not None:
            with contextlib.suppress(Exception):
                await self.registration.stop()
        await self.server.stop()
        if self.metrics is not None:
            with contextlib.suppress(Exception):
                self.metrics.stop()
            self.metrics = None
        if self.etcd is not None and self.owns_etcd:
            with contextlib.suppress(Exception):
                await self.etcd.close()


def run_service(
    role: str,
    parser: argparse.ArgumentParser,
    build: Callable[[argparse.Namespace], ServiceNode],
    argv: list[str] | None = None,
) -> None:
    """The body of every ``llmfleet-<role>`` console script: parse flags, set up logging and tracing
    (before any server or channel exists, so the interceptors are installed), build (a ValueError is a
    usage error), serve."""

    args = parser.parse_args(argv)
    try:  # before any server or channel exists: they read the settings when built
        configure(settings_from_args(args))
    except (SecurityConfigError, ApiKeyError) as e:
        parser.error(str(e))
    setup_logging(args.log_level, role)
    setup_tracing(f"llmfleet-{role}")
    try:
        node = build(args)
    except ValueError as e:  # settings that cannot run (together): a usage error naming them
        parser.error(str(e))
    node.metrics_port = metrics_port(args)
    node.metrics_host = getattr(args, "host", node.metrics_host) or node.metrics_host
    # Everything built so far (imported modules, numpy/scipy, policies: ~76k objects in the scheduler)
    # lives as long as the process: freezing it takes it out of every garbage collection, which
    # otherwise pauses the event loop ~40 ms per full collection (a request's whole latency budget).
    gc.collect()
    gc.freeze()
    asyncio.run(serve_until_signalled(node))


async def serve_until_signalled(node: ServiceNode) -> None:
    """Start ``node``, run until SIGINT/SIGTERM, then stop cleanly (lease revoked, server drained)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await node.start()
    log.info("%s %s serving on %s", node.role, node.node_id, node.address)
    await stop.wait()
    log.info("%s %s shutting down", node.role, node.node_id)
    await node.stop()
