"""``llmfleet-profiler``: serves Predict/Observe and registers under nodes/{id}."""

from __future__ import annotations

import argparse
import logging

from llmfleet.api.v1 import profiler_pb2, profiler_pb2_grpc
from llmfleet.coord import node_view
from llmfleet.predict import EmpiricalLengthPredictor, LengthPredictor, ServiceMeanPredictor
from llmfleet.rpc.cli_args import add_common_args, etcd_settings, node_id
from llmfleet.rpc.node import ServiceNode, run_service
from llmfleet.rpc.server import GrpcServer, service_name

from llmfleet_profiler.characterize import Characterizer
from llmfleet_profiler.servicer import ProfilerServicer

ROLE = "profiler"
log = logging.getLogger(__name__)


def make_predictor(args: argparse.Namespace) -> LengthPredictor:
    """The predictor named by ``--predictor``; a learned one that cannot load degrades to the mean."""
    if args.predictor == "empirical":
        return EmpiricalLengthPredictor()
    if args.predictor == "learned":
        try:
            import torch
            from llmfleet.predict.learned import LearnedLengthPredictor  # torch: only for --predictor learned

            predictor = LearnedLengthPredictor.load(args.predictor_path)
            # one intra-op thread: a prediction is a few tiny matmuls, and idle OpenMP workers that
            # spin for a core add milliseconds of tail latency on small machines
            torch.set_num_threads(1)
            log.info("learned predictor from %s, encoder %s", args.predictor_path, predictor.encoder)
            return predictor
        except Exception as e:  # missing extra or model dir: serve, but say so
            log.error(
                "cannot load the learned predictor from %s (%s); using service_mean", args.predictor_path, e
            )
    return ServiceMeanPredictor(prior_mean=args.prior_mean, prior_std=args.prior_std)


def build_node(args: argparse.Namespace) -> ServiceNode:
    servicer = ProfilerServicer(make_predictor(args))
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
    node = ServiceNode(ROLE, node_id(args, ROLE), etcd_settings(args), server, advertise=args.advertise)

    async def attach(n: ServiceNode) -> None:
        nodes = node_view(n.etcd)
        await nodes.start()
        n.on_stop.append(nodes.stop)
        servicer.characterizer = Characterizer(n.etcd, nodes)

    node.on_etcd.append(attach)
    return node


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmfleet-profiler", description=__doc__)
    add_common_args(ap, ROLE, default_port=50052)
    ap.add_argument("--prior-mean", type=float, default=64.0, help="predicted length before any observation")
    ap.add_argument("--prior-std", type=float, default=32.0)
    ap.add_argument(
        "--predictor",
        default="service_mean",
        choices=["service_mean", "empirical", "learned"],
        help="output-length predictor (learned needs the `predict` extra and --predictor-path)",
    )
    ap.add_argument("--predictor-path", default=".llmfleet/predictor", help="a saved learned predictor")
    return ap


def main(argv: list[str] | None = None) -> None:
    run_service(ROLE, build_parser(), build_node, argv)


if __name__ == "__main__":
    main()
