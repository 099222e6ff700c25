"""``/metrics`` over HTTP with prometheus-client's own server, on the process's registry.

``--metrics-port`` (every service, via ``llmfleet.rpc.cli_args.add_common_args``): default the gRPC port
+ 1000 (any free port when the gRPC port is 0), ``0`` any free port, ``-1`` disabled.
"""

from __future__ import annotations

import argparse
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger(__name__)

METRICS_PORT_OFFSET = 1000
DISABLED = -1

# no ``*_created`` series (as vLLM: they double the exposition and no dashboard reads them)
disable_created_metrics()

_registry: CollectorRegistry | None = None
_lock = threading.Lock()


def process_registry() -> CollectorRegistry:
    """The registry this process's metrics live on (created on first use; not prometheus' global one)."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = CollectorRegistry(auto_describe=True)
        return _registry


def add_metrics_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="Prometheus /metrics port (default: the gRPC port + 1000, any free port when --port is 0; "
        "0 = any free port, -1 = disabled)",
    )


def metrics_port(args: argparse.Namespace) -> int:
    """The port ``--metrics-port`` asks for: -1 disabled, 0 any free port, else that port."""
    port = getattr(args, "metrics_port", None)
    if port is None:
        grpc_port = int(getattr(args, "port", 0) or 0)
        return grpc_port + METRICS_PORT_OFFSET if grpc_port > 0 else 0
    if port < DISABLED:
        raise ValueError(f"--metrics-port must be >= -1, got {port}")
    return port


@dataclass
class MetricsServer:
    host: str
    port: int
    _server: Any
    _thread: threading.Thread

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2.0)


def start_metrics_server(
    port: int, host: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> MetricsServer | None:
    """Serve ``registry`` (default: :func:`process_registry`) on ``host:port``; None when ``port`` is -1."""
    if port == DISABLED:
        return None
    server_cls = _ThreadingWSGIServer6 if ":" in host else ThreadingWSGIServer
    server = make_server(
        host, port, _text_format_app(registry or process_registry()), server_cls, _QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return MetricsServer(host, server.server_address[1], server, thread)


class _ThreadingWSGIServer6(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def _text_format_app(registry: CollectorRegistry):
    """prometheus-client's WSGI app, always answering Prometheus' text format 0.0.4: negotiated
    OpenMetrics, prometheus-client escapes the colon of vLLM's names (``vllm:num_requests_running``
    becomes ``vllm_num_requests_running``), which would break the dashboards and routers that read
    vLLM's names."""
    app = make_wsgi_app(registry)

    def text_only(environ: dict, start_response: Any):
        environ["HTTP_ACCEPT"] = "text/plain; version=0.0.4"
        return app(environ, start_response)

    return text_only


def samples(registry: CollectorRegistry | None = None) -> dict[str, float]:
    """``name{labels}`` -> value from the text exposition of ``registry`` (default: the process's)."""
    out = {}
    for line in generate_latest(registry or process_registry()).decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
