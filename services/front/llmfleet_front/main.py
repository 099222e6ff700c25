"""``llmfleet-front``: the OpenAI-compatible HTTP API as its own processes, in front of the schedulers.

The app is the scheduler's own (``llmfleet_scheduler.http_api.create_app``: the same routes, errors
and streaming); its backend sends each request to a scheduler on the SDK's multiplexed path
(``FrontBackend``). ``--workers N`` runs N processes on one port (SO_REUSEPORT); the parent answers
gRPC health on ``--port``, registers in etcd (role ``front``) and restarts a worker that exits.
``--workers 1`` serves in the process itself. Its ``/metrics`` (the parent's ``--metrics-port``) has
the front's ``llmfleet_front_*``, summed over the workers (``workers.WorkerMetrics``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from dataclasses import dataclass

from llmfleet import __version__
from llmfleet.coord import EtcdClient
from llmfleet.metrics.control import front_metrics
from llmfleet.metrics.server import process_registry
from llmfleet.rpc.cli_args import add_common_args, etcd_settings, node_id, positive_int, setup_logging
from llmfleet.rpc.node import ServiceNode, run_service
from llmfleet.rpc.server import GrpcServer
from llmfleet.security import configure, current, settings_from_args
from llmfleet.telemetry import setup_tracing
from llmfleet_scheduler.http_api import HttpServer, create_app

from llmfleet_front.backend import FrontBackend
from llmfleet_front.cluster_view import ClusterView
from llmfleet_front.http_metrics import HttpMetrics
from llmfleet_front.scheduler_links import SchedulerLinks
from llmfleet_front.workers import WorkerMetrics, Workers, reserve_port

log = logging.getLogger(__name__)

ROLE = "front"
DEFAULT_PORT = 50055  # gRPC health (the parent); the HTTP API on --http-port


@dataclass
class Front:
    """One serving process: the cluster view, the calls to the schedulers, the app's HTTP server."""

    view: ClusterView
    links: SchedulerLinks
    http: HttpServer

    async def stop(self) -> None:
        await self.http.stop()
        await self.links.close()
        await self.view.close()


def build_front(args: argparse.Namespace) -> Front:
    """The serving process's parts; its ``llmfleet_front_*`` metrics go on the process registry (in a
    worker, to the files its parent sums)."""
    schedulers = [a.strip() for a in args.scheduler.split(",") if a.strip()]
    view = ClusterView(schedulers=schedulers)
    security = current()
    metrics = front_metrics()
    links = SchedulerLinks(view.scheduler_addresses, security, on_call=metrics.call_opened)
    backend = FrontBackend(links, view, metrics, own_key=security.api_key)
    app = create_app(backend, version=__version__, key_store=security.key_store)
    app.add_middleware(HttpMetrics, metrics=metrics)
    http = HttpServer(app, host=args.http_host or args.host, port=args.http_port, security=security,
                      reuse_port=True)  # fmt: skip
    return Front(view, links, http)


def build_node(args: argparse.Namespace, argv: list[str]) -> ServiceNode:
    """The front's node (gRPC health, etcd registration, /metrics): with one worker it serves HTTP
    itself; with more it starts them on a port it holds."""
    nid = node_id(args, ROLE)
    server = GrpcServer([], host=args.host, port=args.port)
    node = ServiceNode(ROLE, nid, etcd_settings(args), server, advertise=args.advertise)
    if args.workers == 1:
        front = build_front(args)

        async def attach(n: ServiceNode) -> None:
            assert n.etcd is not None
            await front.view.attach(n.etcd)

        async def start_http(_n: ServiceNode) -> None:
            await front.http.start()

        node.on_etcd.append(attach)
        node.on_start.append(start_http)
        node.on_stop.append(front.stop)
        return node
    try:
        held = reserve_port(args.http_host or args.host, args.http_port)
    except OSError as e:
        raise ValueError(f"--http-port {args.http_port}: {e}") from None
    files = WorkerMetrics(node.metrics_registry or process_registry())  # the workers' metrics, summed
    log.info("front %s: the workers' metrics files in %s", nid, files.path)
    workers = Workers(argv, nid, held.getsockname()[1], args.workers, env=files.env(), on_exit=files.exited)

    async def start_workers(n: ServiceNode) -> None:
        workers.start()
        n.spawn(workers.supervise(), "front-workers")

    async def stop_workers() -> None:
        await workers.stop()
        held.close()
        files.close()

    node.on_start.append(start_workers)
    node.on_stop.append(stop_workers)
    return node


async def run_worker(args: argparse.Namespace) -> None:
    """One worker (``--port -1``): the HTTP API until SIGINT/SIGTERM; etcd is followed in the background."""
    front = build_front(args)
    etcd = EtcdClient(etcd_settings(args))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def attach() -> None:
        await etcd.connect(wait=True)
        await front.view.attach(etcd)

    await front.http.start()
    attaching = asyncio.create_task(attach(), name="front-etcd-attach")
    log.info("front worker %s serving %s", args.id, front.http.url)
    await stop.wait()
    attaching.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await attaching
    await front.stop()
    with contextlib.suppress(Exception):
        await etcd.close()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmfleet-front", description=__doc__)
    add_common_args(ap, ROLE, default_port=DEFAULT_PORT)
    ap.add_argument("--http-port", type=int, default=8000, help="the OpenAI-compatible API (0: a free port)")
    ap.add_argument("--http-host", default=None, help="its bind address (default: --host)")
    ap.add_argument("--workers", type=positive_int, default=1,
                    help="processes serving --http-port together (SO_REUSEPORT; default 1)")  # fmt: skip
    ap.add_argument(
        "--scheduler",
        default=os.environ.get("LLMFLEET_SCHEDULER", ""),
        help="scheduler replicas host:port[,host:port] (env LLMFLEET_SCHEDULER; default: the "
        "schedulers registered in etcd)",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.port >= 0:
        run_service(ROLE, parser, lambda a: build_node(a, argv), argv)
        return
    configure(settings_from_args(args))  # a worker: its parent checked the flags
    setup_logging(args.log_level, f"{ROLE} {args.id or ''}".strip())
    setup_tracing(f"llmfleet-{ROLE}")
    gc.collect()  # as run_service does: what is built by now lives as long as the process
    gc.freeze()
    asyncio.run(run_worker(args))


if __name__ == "__main__":
    main()
