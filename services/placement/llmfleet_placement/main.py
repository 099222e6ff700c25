"""``llmfleet-placement``: leader-elected placement controller (config -> desired state in etcd)."""

from __future__ import annotations

import argparse
import asyncio
import logging

from llmfleet.api.v1 import placement_pb2, placement_pb2_grpc
from llmfleet.config import DEFAULT_CONFIG, ClusterConfig
from llmfleet.coord import LeaderElection, node_view, placement_view, service_view
from llmfleet.rpc.cli_args import add_common_args, etcd_settings, node_id
from llmfleet.rpc.node import ServiceNode, run_service
from llmfleet.rpc.server import GrpcServer, service_name

from llmfleet_placement.controller import PlacementController
from llmfleet_placement.servicer import PlacementServicer

ROLE = "placement"
log = logging.getLogger(__name__)


def build_node(args: argparse.Namespace, config: ClusterConfig) -> tuple[ServiceNode, PlacementServicer]:
    nid = node_id(args, ROLE)
    servicer = PlacementServicer(nid)
    server = GrpcServer(
        [
            (
                placement_pb2_grpc.add_PlacementServicer_to_server,
                servicer,
                service_name(placement_pb2, "Placement"),
            )
        ],
        host=args.host,
        port=args.port,
    )
    node = ServiceNode(ROLE, nid, etcd_settings(args), server, advertise=args.advertise)

    async def lead(n: ServiceNode) -> None:
        views = placement_view(n.etcd), service_view(n.etcd), node_view(n.etcd)
        for v in views:
            await v.start()
        servicer.placement_view, servicer.nodes_view = views[0], views[2]
        servicer.election = LeaderElection(n.etcd, ROLE, nid, n.settings.lease_ttl_s)
        controller = PlacementController(config, n.etcd, *views, resync_s=args.resync_s)
        task: asyncio.Task | None = None

        async def on_elected() -> None:
            nonlocal task
            log.info("%s is the placement leader", nid)
            task = asyncio.create_task(controller.run())

        async def on_lost() -> None:
            log.warning("%s lost placement leadership", nid)
            if task is not None:
                task.cancel()

        servicer.views = views
        n.spawn(servicer.election.run(on_elected, on_lost), "placement-election")

    node.on_etcd.append(lead)
    node.on_stop.append(servicer.shutdown)
    return node, servicer


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmfleet-placement", description=__doc__)
    add_common_args(ap, ROLE, default_port=50053)
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="cluster config (services -> models -> engines)")
    ap.add_argument("--resync-s", type=float, default=5.0, help="periodic full reconcile interval")
    return ap


def main(argv: list[str] | None = None) -> None:
    def build(args: argparse.Namespace) -> ServiceNode:
        try:
            config = ClusterConfig.load(args.config)
        except ValueError as e:  # pydantic ValidationError is a ValueError
            raise SystemExit(f"llmfleet-placement: invalid config {args.config}: {e}") from None
        return build_node(args, config)[0]

    run_service(ROLE, build_parser(), build, argv)


if __name__ == "__main__":
    main()
