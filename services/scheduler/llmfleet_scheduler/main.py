"""``llmfleet-scheduler``: the request front door (Submit stream, Cancel, ListServices)."""

from __future__ import annotations

import argparse

from llmfleet import __version__
from llmfleet.api.v1 import scheduler_pb2, scheduler_pb2_grpc
from llmfleet.coord import node_view, service_view
from llmfleet.coord.desired import model_view
from llmfleet.coord.migration_state import migration_state_view
from llmfleet.coord.unplaced import unplaced_view
from llmfleet.load.monitor import LoadMonitor
from llmfleet.policies.capacity import BINDINGS, Saturation
from llmfleet.policies.dispatch import POLICIES
from llmfleet.rpc.cli_args import add_common_args, etcd_settings, json_object, node_id
from llmfleet.rpc.node import ServiceNode, run_service
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.security import current as current_security
from llmfleet.telemetry import tracing_enabled

from llmfleet_scheduler.admission import DEFAULT_MAX_QUEUED_TOKENS, DEFAULT_MAX_WAITING, Admission
from llmfleet_scheduler.capacity import CapacityGate
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.engine_links import MUX, PATHS, EngineLinks
from llmfleet_scheduler.http_api import HttpServer, ServicerBackend, create_app
from llmfleet_scheduler.readiness import Readiness
from llmfleet_scheduler.rebalance import LiveRebalance, QueuedMoves
from llmfleet_scheduler.relay import Relay
from llmfleet_scheduler.routing import DispatchRouter, MellViewReader, PredictionBatcher
from llmfleet_scheduler.scls_central import EngineView, SclsCentral
from llmfleet_scheduler.servicer import SchedulerServicer
from llmfleet_scheduler.stats_reporter import StatsReporter

ROLE = "scheduler"


def build_node(args: argparse.Namespace) -> tuple[ServiceNode, SchedulerServicer]:
    # engine load: one WatchLoad stream per engine feeds the directory's load book (the candidates)
    monitor = LoadMonitor(interval_s=args.load_interval_s) if args.load_monitor else None
    directory = ClusterDirectory(monitor=monitor)
    if monitor is not None:
        monitor.listeners.append(directory.load)
    router = DispatchRouter(args.dispatch, hardware=args.hardware, load_source=monitor is not None)
    router.check_default()  # a default policy that reads load with no load source: refused at start
    predictions = (
        PredictionBatcher(directory, window_s=args.predict_window_s) if args.predict != "never" else None
    )
    nid = node_id(args, ROLE)
    # per-service statistics streamed to the placement leader (the service monitor); 0 = off
    stats = (
        StatsReporter(nid, directory, interval_s=args.stats_interval_s) if args.stats_interval_s > 0 else None
    )
    central = SclsCentral.from_options(lambda model: engines_for(directory, model), args.scls_options)
    # requests wait here for capacity: a model no engine hosts (scale from zero), and with --binding
    # late every host saturated (issue 26)
    gate = CapacityGate(
        directory,
        binding=args.binding,
        saturation=Saturation(args.queue_slack, args.kv_room_fraction),
        cold_start=args.cold_start,
        on_wait=stats.kick if stats is not None else None,
    )
    if monitor is not None:
        monitor.listeners.append(gate)  # after the load book: the pump reads the updated book
    relay = Relay(
        directory,
        router,
        predictions,
        max_attempts=args.max_attempts,
        predict_mode=args.predict,
        stats=stats,
        central=central,
        gate=gate,
        # tracing keeps a call per request: each request's engine span stays in its own trace
        links=EngineLinks(directory) if args.engine_path == MUX and not tracing_enabled() else None,
    )
    servicer = SchedulerServicer(
        directory,
        relay,
        orphan_grace_s=args.orphan_grace_s,
        admission=Admission(args.max_waiting, args.max_queued_tokens),
    )
    if stats is not None:  # each report carries the services' backlog (requests not started, cold)

        def backlog() -> dict[str, tuple[int, int, int]]:
            held = gate.held()
            return {
                s: (servicer.admission.waiting(s)[0], *held.get(s, (0, 0)))
                for s in {*held, *directory.services()}
            }

        stats.backlog = backlog
    scheduler_service = service_name(scheduler_pb2, "Scheduler")
    server = GrpcServer(
        [
            (
                scheduler_pb2_grpc.add_SchedulerServicer_to_server,
                servicer,
                scheduler_service,
            )
        ],
        host=args.host,
        port=args.port,
        gated=frozenset({scheduler_service}) if args.ready_when == "servable" else frozenset(),
    )
    node = ServiceNode(ROLE, nid, etcd_settings(args), server, advertise=args.advertise)
    readiness = (
        Readiness(directory, lambda ok: server.set_service_serving(scheduler_service, ok))
        if args.ready_when == "servable"
        else None
    )
    servicer.readiness = readiness

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
        n.spawn(relay.watch_engines(), "scheduler-engine-watch")  # cut streams of engines that left
        if stats is not None:
            stats.etcd = n.etcd
            n.spawn(stats.run(), "scheduler-stats-reporter")
        if readiness is not None:
            etcd = n.etcd

            async def seeded() -> bool:
                return await etcd.get(etcd.keys.services_seeded, timeout=2.0) is not None

            readiness.seeded = seeded
            n.spawn(readiness.follow(), "scheduler-readiness")
        migration = migration_state_view(n.etcd)  # the migration leader's Mell view (mell dispatch)
        await migration.start()
        router.mell_view = MellViewReader(lambda: migration.snapshot().get(""))
        n.on_stop.append(migration.stop)

    node.on_etcd.append(attach_views)

    async def run_central(n: ServiceNode) -> None:
        await central.run()  # idle (one timer) until a service with dispatch scls_central has requests

    node.on_start.append(run_central)

    async def run_gate(n: ServiceNode) -> None:
        await gate.run()  # dispatches held requests when capacity comes

    node.on_start.append(run_gate)

    if args.rebalance_interval_s > 0:  # Aladdin's Algorithm 2 for rebalancing dispatch policies

        def started(rid: str) -> bool:
            rec = servicer.journal.get(rid)
            return rec is None or rec.first_token_at is not None or rec.done

        queued = (
            QueuedMoves(directory, servicer.journal.live, Saturation(args.queue_slack, args.kv_room_fraction))
            if args.move_queued
            else None
        )
        rebalance = LiveRebalance(
            router, relay, directory, started, epoch_s=args.rebalance_interval_s, queued=queued
        )

        async def run_rebalance(n: ServiceNode) -> None:
            await rebalance.run()

        node.on_start.append(run_rebalance)
    if args.http_port >= 0:  # the OpenAI-compatible API, through the servicer's own submit path
        http = HttpServer(
            create_app(
                ServicerBackend(servicer), version=__version__, key_store=current_security().key_store
            ),
            host=args.http_host or args.host,
            port=args.http_port,
            security=current_security(),
        )

        async def start_http(_n: ServiceNode) -> None:
            await http.start()

        node.on_start.append(start_http)
        node.on_stop.append(http.stop)
    node.on_stop.append(servicer.close)
    if relay.links is not None:
        node.on_stop.append(relay.links.close)
    if relay.observations is not None:
        node.on_stop.append(relay.observations.close)  # send the last batch before the channels close
    node.on_stop.append(directory.close)
    return node, servicer


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmfleet-scheduler", description=__doc__)
    add_common_args(ap, ROLE, default_port=50051)
    ap.add_argument("--dispatch", default="round_robin", choices=sorted(POLICIES), help="dispatch policy")
    ap.add_argument("--max-attempts", type=int, default=3, help="engines tried per request on failure")
    ap.add_argument(
        "--engine-path",
        choices=PATHS,
        default=MUX,
        help="mux: every request to an engine on one multiplexed GenerateMany call, tokens in batches; "
        "per-request: a Generate call per request (the path before issue 23; always used with tracing on)",
    )
    ap.add_argument(
        "--predict",
        choices=("auto", "always", "never"),
        default="auto",
        help="ask the profiler for output lengths before dispatch: auto = for services with "
        "`predict: true` or whose dispatch policy reads predictions (default)",
    )
    ap.add_argument(
        "--no-predict", dest="predict", action="store_const", const="never", help="= --predict never"
    )
    ap.add_argument(
        "--predict-window-s", type=float, default=0.002, help="requests within this window share one Predict"
    )
    ap.add_argument(
        "--load-interval-s", type=float, default=0.5, help="WatchLoad snapshot interval of the load monitor"
    )
    ap.add_argument(
        "--no-load-monitor",
        dest="load_monitor",
        action="store_false",
        help="follow no engine load: dispatch sees only this scheduler's own outstanding requests, and "
        "policies that read load (jsq, least_loaded, ...) are refused",
    )
    ap.add_argument("--hardware", default="cpu", help="catalog hardware of the engines (cost-model policies)")
    ap.add_argument(
        "--orphan-grace-s", type=float, default=2.0, help="cancel a request this long after its client left"
    )
    ap.add_argument(
        "--stats-interval-s",
        type=float,
        default=2.0,
        help="stream per-service statistics to the placement leader this often (0: never)",
    )
    ap.add_argument(
        "--http-port",
        type=int,
        default=8000,
        help="port of the OpenAI-compatible HTTP API (0: pick a free one, logged; -1: no HTTP API)",
    )
    ap.add_argument("--http-host", default=None, help="bind address of the HTTP API (default: --host)")
    ap.add_argument(
        "--rebalance-interval-s",
        type=float,
        default=1.0,
        help="epoch of Aladdin's Algorithm 2 for dispatch policies that rebalance (aladdin_bestfit): "
        "not-started requests move between engines (0 = off)",
    )
    ap.add_argument(
        "--scls-options",
        type=json_object,
        default={},
        help="SCLS central scheduling (services with dispatch: scls_central), a JSON object: slice_iterations "
        "(S, 128), lam (λ, 0.5), gamma_s (Γ, 6.0: the paper's HF value), zeta (0.9), max_batch (256), cost",
    )
    ap.add_argument(
        "--binding",
        choices=BINDINGS,
        default="late",
        help="late: hold a request in the scheduler while every engine hosting its model is saturated "
        "(its queue past its batch + --queue-slack, or its KV past --kv-room-fraction), and dispatch it "
        "when one has room; early: bind every request to an engine on arrival (the queue stays there)",
    )
    ap.add_argument(
        "--move-queued",
        action="store_true",
        help="every --rebalance-interval-s, move requests that have not started off engines past their "
        "room (batch + --queue-slack) onto engines of the same model with room, for any dispatch policy "
        "(the alternative to --binding late)",
    )
    ap.add_argument(
        "--queue-slack",
        type=int,
        default=4,
        help="late binding: requests an engine may queue beyond its batch",
    )
    ap.add_argument(
        "--kv-room-fraction",
        type=float,
        default=0.95,
        help="late binding: an engine whose KV (used + queued prompts) is past this share has no room",
    )
    ap.add_argument(
        "--no-cold-start",
        dest="cold_start",
        action="store_false",
        help="fail a request for a model no engine hosts at once (UNAVAILABLE) instead of holding it "
        "until placement loads the model (the service's cold_start_timeout_s)",
    )
    ap.add_argument(
        "--ready-when",
        choices=("servable", "started"),
        default="servable",
        help="when the Scheduler service's gRPC health (and HTTP /ready) says SERVING: servable = every "
        "service not marked scale_to_zero has an engine with its model loaded; started = at once",
    )
    ap.add_argument(
        "--max-waiting",
        type=_positive,
        default=DEFAULT_MAX_WAITING,
        help="per service: requests admitted without a first token yet; past it RESOURCE_EXHAUSTED / 429 "
        "(a service's max_waiting overrides)",
    )
    ap.add_argument(
        "--max-queued-tokens",
        type=_positive,
        default=DEFAULT_MAX_QUEUED_TOKENS,
        help="per service: their estimated prompt tokens + max_tokens (a service's max_queued_tokens overrides)",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()

    def build(args: argparse.Namespace) -> ServiceNode:
        try:
            return build_node(args)[0]
        except ValueError as e:  # flags that cannot work together (e.g. a load-reading policy, no load)
            parser.error(str(e))

    run_service(ROLE, parser, build, argv)


if __name__ == "__main__":
    main()


def engines_for(directory: ClusterDirectory, model: str) -> list[EngineView]:
    """Live engines hosting ``model`` with their KV capacity in tokens (when the engines report it)."""
    bpt = directory.load.kv_bytes_per_token(model)
    return [
        EngineView(n.node_id, int(n.kv_capacity_bytes // bpt) if bpt and n.kv_capacity_bytes else None)
        for n in sorted(directory.engines().values(), key=lambda n: n.node_id)
        if model in n.models
    ]


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value
