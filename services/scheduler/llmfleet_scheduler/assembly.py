"""The scheduler node assembled from its flags, in parts: the scheduler's objects (``build_parts``),
the gRPC node with its readiness (``grpc_node``), the etcd views it follows (``attach_views_hook``),
and the hooks that start and stop the background loops and the HTTP API."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmfleet import __version__
from llmfleet.api.v1 import scheduler_pb2, scheduler_pb2_grpc
from llmfleet.coord import node_view, service_view
from llmfleet.coord.desired import model_view
from llmfleet.coord.migration_state import migration_state_view
from llmfleet.coord.unplaced import unplaced_view
from llmfleet.load.monitor import LoadMonitor
from llmfleet.metrics.control import SchedulerMetrics, scheduler_metrics
from llmfleet.rpc.cli_args import etcd_settings
from llmfleet.rpc.node import ServiceNode
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.security import current as current_security
from llmfleet.security.limit_shares import KeyShares
from llmfleet.spec.live_loops import SCHEDULER_FLAGS, SchedulerConfig
from llmfleet.token_estimate import PromptTokens

from llmfleet_scheduler.admission import Admission
from llmfleet_scheduler.capacity import CapacityGate
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.engine_links import EngineLinks
from llmfleet_scheduler.http_api import HttpServer, ServicerBackend, create_app
from llmfleet_scheduler.key_shares import LiveKeyShares
from llmfleet_scheduler.observe import ObservationBatcher
from llmfleet_scheduler.priorities import RequestClasses
from llmfleet_scheduler.readiness import Readiness
from llmfleet_scheduler.rebalance import LiveRebalance, QueuedMoves
from llmfleet_scheduler.relay import Relay
from llmfleet_scheduler.routing import DispatchRouter, MellViewReader, PredictionBatcher
from llmfleet_scheduler.scls_central import EngineView, SclsCentral
from llmfleet_scheduler.servicer import SchedulerServicer
from llmfleet_scheduler.stats_reporter import StatsReporter

ROLE = "scheduler"
NodeHook = Callable[[ServiceNode], Awaitable[None]]


@dataclass
class SchedulerParts:
    """The scheduler's objects, built from its flags before the node exists."""

    config: SchedulerConfig  # the cluster file's scheduler: section, as the flags give it
    monitor: LoadMonitor | None  # engine load: one WatchLoad stream per engine (None: --no-load-monitor)
    directory: ClusterDirectory
    router: DispatchRouter
    stats: StatsReporter | None  # per-service statistics to the placement leader (None: off)
    central: SclsCentral
    gate: CapacityGate
    relay: Relay
    servicer: SchedulerServicer


def engines_for(directory: ClusterDirectory, model: str) -> list[EngineView]:
    """Live engines hosting ``model`` with their KV capacity in tokens (when the engines report it)."""
    bpt = directory.load.kv_bytes_per_token(model)
    return [
        EngineView(n.node_id, int(n.kv_capacity_bytes // bpt) if bpt and n.kv_capacity_bytes else None)
        for n in sorted(directory.engines().values(), key=lambda n: n.node_id)
        if model in n.models
    ]


def _router(args: argparse.Namespace, load_source: bool) -> DispatchRouter:
    router = DispatchRouter(
        args.dispatch, hardware=args.hardware, load_source=load_source, default_options=args.dispatch_options
    )
    # a default policy that reads load with no load source, or bad --dispatch-options: refused at start
    router.check_default()
    return router


def _gate(
    config: SchedulerConfig,
    directory: ClusterDirectory,
    stats: StatsReporter | None,
    metrics: SchedulerMetrics,
    classes: RequestClasses,
) -> CapacityGate:
    """Requests wait here for capacity: a model no engine hosts (scale from zero), and with --binding
    late every host saturated; in the order of their priorities and --fairness."""
    return CapacityGate(
        directory,
        binding=config.binding,
        saturation=config.saturation(),
        cold_start=config.cold_start,
        metrics=metrics,
        on_wait=stats.kick if stats is not None else None,
        fairness=config.fairness,
        preemption=config.preemption_rule(),
        classes=classes,
    )


def _backlog(
    gate: CapacityGate, servicer: SchedulerServicer, directory: ClusterDirectory
) -> Callable[[], dict[str, tuple[int, int, int]]]:
    """Each service's backlog for the stats reports: requests not started, and those held (cold)."""

    def backlog() -> dict[str, tuple[int, int, int]]:
        held = gate.held()
        return {
            s: (servicer.admission.waiting(s)[0], *held.get(s, (0, 0)))
            for s in {*held, *directory.services()}
        }

    return backlog


def build_parts(args: argparse.Namespace, nid: str) -> SchedulerParts:
    """The scheduler's objects (ValueError for flags that cannot work together)."""
    monitor = LoadMonitor(interval_s=args.load_interval_s) if args.load_monitor else None
    directory = ClusterDirectory(monitor=monitor)
    if monitor is not None:
        monitor.listeners.append(directory.load)  # the directory's load book: the candidates
    router = _router(args, monitor is not None)
    config: SchedulerConfig = SCHEDULER_FLAGS.read(args)
    predictions = (
        PredictionBatcher(directory, window_s=args.predict_window_s) if args.predict != "never" else None
    )
    stats = (
        StatsReporter(nid, directory, interval_s=args.stats_interval_s) if args.stats_interval_s > 0 else None
    )
    central = SclsCentral.from_options(lambda model: engines_for(directory, model), args.scls_options)
    metrics = scheduler_metrics()
    classes = RequestClasses(metrics)
    gate = _gate(config, directory, stats, metrics, classes)
    if monitor is not None:
        monitor.listeners.append(gate)  # after the load book: the pump reads the updated book
    prompt_tokens = PromptTokens()  # the relay's engine counts scale the servicer's estimates
    relay = Relay(
        directory,
        router,
        EngineLinks(directory),
        gate,
        ObservationBatcher(directory),
        metrics,
        predictions,
        max_attempts=args.max_attempts,
        predict_mode=args.predict,
        stats=stats,
        central=central,
        prompt_tokens=prompt_tokens,
    )
    servicer = SchedulerServicer(
        directory,
        relay,
        orphan_grace_s=args.orphan_grace_s,
        admission=Admission(args.max_waiting, args.max_queued_tokens, displace=gate.displace),
        classes=classes,
        key_shares=KeyShares(nid),
        prompt_tokens=prompt_tokens,
    )
    gate.refuse = servicer.refuse  # a displaced or shed request's record fails RESOURCE_EXHAUSTED
    if stats is not None:  # each report carries the services' backlog (requests not started, cold)
        stats.backlog = _backlog(gate, servicer, directory)
    return SchedulerParts(config, monitor, directory, router, stats, central, gate, relay, servicer)


def grpc_node(
    args: argparse.Namespace, nid: str, parts: SchedulerParts
) -> tuple[ServiceNode, Readiness | None]:
    """The node serving the Scheduler service; with --ready-when servable, its health follows readiness."""
    scheduler_service = service_name(scheduler_pb2, "Scheduler")
    gated = parts.config.ready_when == "servable"
    server = GrpcServer(
        [(scheduler_pb2_grpc.add_SchedulerServicer_to_server, parts.servicer, scheduler_service)],
        host=args.host,
        port=args.port,
        gated=frozenset({scheduler_service}) if gated else frozenset(),
    )
    node = ServiceNode(ROLE, nid, etcd_settings(args), server, advertise=args.advertise)
    readiness = (
        Readiness(parts.directory, lambda ok: server.set_service_serving(scheduler_service, ok))
        if gated
        else None
    )
    parts.servicer.readiness = readiness
    return node, readiness


def _follow_readiness(n: ServiceNode, readiness: Readiness) -> None:
    etcd = n.etcd

    async def seeded() -> bool:
        return await etcd.get(etcd.keys.services_seeded, timeout=2.0) is not None

    readiness.seeded = seeded
    n.spawn(readiness.follow(), "scheduler-readiness")


def attach_views_hook(parts: SchedulerParts, readiness: Readiness | None) -> NodeHook:
    """The on_etcd hook: the etcd views the scheduler reads, and the loops that follow them."""
    directory, monitor, stats = parts.directory, parts.monitor, parts.stats

    async def attach_views(n: ServiceNode) -> None:
        directory.services_view = service_view(n.etcd)
        directory.nodes_view = node_view(n.etcd)
        directory.models_view = model_view(n.etcd)
        directory.unplaced_view = unplaced_view(n.etcd)
        await directory.services_view.start()
        await directory.nodes_view.start()
        await directory.models_view.start()
        await directory.unplaced_view.start()
        if monitor is not None:
            n.spawn(monitor.track(directory.nodes_view), "scheduler-load-monitor")
        n.spawn(parts.relay.watch_engines(), "scheduler-engine-watch")  # cut streams of engines that left
        if stats is not None:
            stats.etcd = n.etcd
            n.spawn(stats.run(), "scheduler-stats-reporter")
        if readiness is not None:
            _follow_readiness(n, readiness)
        if parts.servicer.key_shares is not None:  # API keys' limits split among the replicas
            shares = LiveKeyShares(n.etcd, parts.servicer.key_shares)
            await shares.start()
            n.spawn(shares.publish(), "scheduler-key-shares-publish")
            n.spawn(shares.follow(), "scheduler-key-shares-follow")
            n.on_stop.append(shares.stop)
        migration = migration_state_view(n.etcd)  # the migration leader's Mell view (mell dispatch)
        await migration.start()
        parts.router.mell_view = MellViewReader(lambda: migration.snapshot().get(""))
        n.on_stop.append(migration.stop)

    return attach_views


def add_loops(node: ServiceNode, args: argparse.Namespace, parts: SchedulerParts) -> None:
    """Start hooks of the background loops: SCLS central, the capacity gate, and rebalancing."""

    async def run_central(n: ServiceNode) -> None:
        await parts.central.run()  # idle (one timer) until a service with dispatch scls_central has requests

    async def run_gate(n: ServiceNode) -> None:
        await parts.gate.run()  # dispatches held requests when capacity comes

    node.on_start.extend([run_central, run_gate])
    if args.rebalance_interval_s > 0:  # Aladdin's Algorithm 2 for rebalancing dispatch policies
        rebalance = _rebalance(args, parts)

        async def run_rebalance(n: ServiceNode) -> None:
            await rebalance.run()

        node.on_start.append(run_rebalance)


def _rebalance(args: argparse.Namespace, parts: SchedulerParts) -> LiveRebalance:
    servicer = parts.servicer

    def started(rid: str) -> bool:
        rec = servicer.journal.get(rid)
        return rec is None or rec.first_token_at is not None or rec.done

    config = parts.config
    queued = (
        QueuedMoves(parts.directory, servicer.journal.live, config.saturation())
        if config.move_queued
        else None
    )
    return LiveRebalance(
        parts.router, parts.relay, parts.directory, started, epoch_s=args.rebalance_interval_s, queued=queued
    )


def add_http(node: ServiceNode, args: argparse.Namespace, servicer: SchedulerServicer) -> None:
    """The OpenAI-compatible API (unless --http-port -1), through the servicer's own submit path."""
    if args.http_port < 0:
        return
    http = HttpServer(
        create_app(ServicerBackend(servicer), version=__version__, key_store=current_security().key_store),
        host=args.http_host or args.host,
        port=args.http_port,
        security=current_security(),
    )

    async def start_http(_n: ServiceNode) -> None:
        await http.start()

    node.on_start.append(start_http)
    node.on_stop.append(http.stop)


def add_stops(node: ServiceNode, parts: SchedulerParts) -> None:
    """Shutdown hooks, in order: the servicer, the engine links, the last observations, the directory."""
    node.on_stop.append(parts.servicer.close)
    node.on_stop.append(parts.relay.links.close)
    node.on_stop.append(parts.relay.observations.close)  # send the last batch before the channels close
    node.on_stop.append(parts.directory.close)
