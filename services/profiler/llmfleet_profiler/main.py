"""``llmfleet-profiler``: serves Predict/Observe and registers under nodes/{id}."""

from __future__ import annotations

import argparse

from llmfleet.api.v1 import profiler_pb2, profiler_pb2_grpc
from llmfleet.predict import ServiceMeanPredictor
from llmfleet.rpc.cli_args import add_common_args, etcd_settings, node_id
from llmfleet.rpc.node import ServiceNode, run_service
from llmfleet.rpc.server import GrpcServer, service_name

from llmfleet_profiler.servicer import ProfilerServicer

ROLE = "profiler"


def build_node(args: argparse.Namespace) -> ServiceNode:
    predictor = ServiceMeanPredictor(prior_mean=args.prior_mean, prior_std=args.prior_std)
    servicer = ProfilerServicer(predictor)
    server = GrpcServer(
        [
            (
                profiler_pb2_grpc.add_ProfilerServicer_to_server,
                servicer,
                service_name(profiler_pb2, "Profiler"),
            )
        ],
        host=args.host,
        port=args.port,
    )
    return ServiceNode(ROLE, node_id(args, ROLE), etcd_settings(args), server, advertise=args.advertise)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmfleet-profiler", description=__doc__)
    add_common_args(ap, ROLE, default_port=50052)
    ap.add_argument("--prior-mean", type=float, default=64.0, help="predicted length before any observation")
    ap.add_argument("--prior-std", type=float, default=32.0)
    return ap


def main(argv: list[str] | None = None) -> None:
    run_service(ROLE, build_parser(), build_node, argv)


if __name__ == "__main__":
    main()
