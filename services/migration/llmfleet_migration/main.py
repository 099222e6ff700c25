"""``llmfleet-migration``: leader-elected migration coordinator; serves Status (per-engine KV use)."""

from __future__ import annotations

import argparse
import contextlib
import logging

from llmfleet.api.v1 import migration_pb2, migration_pb2_grpc
from llmfleet.coord import LeaderElection, node_view
from llmfleet.load.monitor import LoadMonitor
from llmfleet.rpc.cli_args import add_common_args, etcd_settings, node_id
from llmfleet.rpc.node import ServiceNode, run_service
from llmfleet.rpc.server import GrpcServer, service_name

from llmfleet_migration.servicer import MigrationServicer

ROLE = "migration"
log = logging.getLogger(__name__)


def build_node(args: argparse.Namespace) -> tuple[ServiceNode, MigrationServicer]:
    nid = node_id(args, ROLE)
    monitor = LoadMonitor(interval_s=args.load_interval_s)
    servicer = MigrationServicer(nid, monitor)
    server = GrpcServer(
        [
            (
                migration_pb2_grpc.add_MigrationServicer_to_server,
                servicer,
                service_name(migration_pb2, "Migration"),
            )
        ],
        host=args.host,
        port=args.port,
    )
    node = ServiceNode(ROLE, nid, etcd_settings(args), server, advertise=args.advertise)

    async def attach(n: ServiceNode) -> None:
        nodes = node_view(n.etcd)
        await nodes.start()
        # Every replica follows engine load so a standby can take over with a warm picture.
        n.spawn(monitor.track(nodes), "migration-load-monitor")
        servicer.election = LeaderElection(n.etcd, ROLE, nid, n.settings.lease_ttl_s)

        async def on_elected() -> None:
            log.info("%s is the migration leader", nid)

        async def on_lost() -> None:
            log.warning("%s lost migration leadership", nid)

        n.spawn(servicer.election.run(on_elected, on_lost), "migration-election")

    node.on_etcd.append(attach)

    async def cleanup() -> None:
        await monitor.close()
        if servicer.election is not None:
            with contextlib.suppress(Exception):
                await servicer.election.resign()

    node.on_stop.append(cleanup)
    return node, servicer


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmfleet-migration", description=__doc__)
    add_common_args(ap, ROLE, default_port=50054)
    ap.add_argument("--load-interval-s", type=float, default=1.0, help="WatchLoad snapshot interval")
    return ap


def main(argv: list[str] | None = None) -> None:
    run_service(ROLE, build_parser(), lambda args: build_node(args)[0], argv)


if __name__ == "__main__":
    main()
