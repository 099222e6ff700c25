"""``llmfleet-scheduler``: the request front door (Submit stream, Cancel, ListServices)."""

from __future__ import annotations

import argparse

from llmfleet.api.v1 import scheduler_pb2, scheduler_pb2_grpc
from llmfleet.coord import node_view, service_view
from llmfleet.policies.dispatch import POLICIES
from llmfleet.rpc.cli_args import add_common_args, etcd_settings, node_id
from llmfleet.rpc.node import ServiceNode, run_service
from llmfleet.rpc.server import GrpcServer, service_name

from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.relay import Relay
from llmfleet_scheduler.routing import DispatchRouter, PredictionBatcher
from llmfleet_scheduler.servicer import SchedulerServicer

ROLE = "scheduler"


def build_node(args: argparse.Namespace) -> tuple[ServiceNode, SchedulerServicer]:
    directory = ClusterDirectory()
    predictions = (
        PredictionBatcher(directory, window_s=args.predict_window_s) if args.predict != "never" else None
    )
    relay = Relay(
        directory,
        DispatchRouter(args.dispatch, hardware=args.hardware),
        predictions,
        max_attempts=args.max_attempts,
        predict_mode=args.predict,
    )
    servicer = SchedulerServicer(directory, relay, orphan_grace_s=args.orphan_grace_s)
    server = GrpcServer(
        [
            (
                scheduler_pb2_grpc.add_SchedulerServicer_to_server,
                servicer,
                service_name(scheduler_pb2, "Scheduler"),
            )
        ],
        host=args.host,
        port=args.port,
    )
    node = ServiceNode(ROLE, node_id(args, ROLE), etcd_settings(args), server, advertise=args.advertise)

    async def attach_views(n: ServiceNode) -> None:
        directory.services_view = service_view(n.etcd)
        directory.nodes_view = node_view(n.etcd)
        await directory.services_view.start()
        await directory.nodes_view.start()

    node.on_etcd.append(attach_views)
    node.on_stop.append(servicer.close)
    node.on_stop.append(directory.close)
    return node, servicer


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmfleet-scheduler", description=__doc__)
    add_common_args(ap, ROLE, default_port=50051)
    ap.add_argument("--dispatch", default="round_robin", choices=sorted(POLICIES), help="dispatch policy")
    ap.add_argument("--max-attempts", type=int, default=3, help="engines tried per request on failure")
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
    ap.add_argument("--hardware", default="cpu", help="catalog hardware of the engines (cost-model policies)")
    ap.add_argument(
        "--orphan-grace-s", type=float, default=2.0, help="cancel a request this long after its client left"
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    run_service(ROLE, build_parser(), lambda args: build_node(args)[0], argv)


if __name__ == "__main__":
    main()
