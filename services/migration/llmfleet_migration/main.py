"""``llmfleet-migration``: leader-elected migration coordinator.

Every replica follows the engines' load streams (a standby takes over with a warm picture); the
leader runs ``--policy`` (mell, llumnix_lb, none) every ``--epoch-s`` and executes its migrations
(``coordinator.py``). Status shows per-engine KV use, active flags, Mell GPU types, migrations and
epochs."""

from __future__ import annotations

import argparse
import contextlib
import logging

from llmfleet.api.v1 import migration_pb2, migration_pb2_grpc
from llmfleet.coord import LeaderElection, node_view
from llmfleet.load.monitor import LoadMonitor
from llmfleet.policies.migration import make_migration_policy, make_transfer_planner
from llmfleet.rpc.cli_args import add_common_args, etcd_settings, node_id
from llmfleet.rpc.node import ServiceNode, run_service
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.spec.live_loops import MIGRATION_FLAGS, MigrationConfig

from llmfleet_migration.coordinator import MigrationCoordinator
from llmfleet_migration.costs import CostModels
from llmfleet_migration.executor import MigrationExecutor
from llmfleet_migration.servicer import MigrationServicer

ROLE = "migration"
log = logging.getLogger(__name__)


def probe_size(text: str) -> int:
    """``--probe-bytes``: 0 (no probes) up to the engines' 1 GiB limit."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of bytes: {text!r}") from None
    if not 0 <= n <= 1 << 30:
        raise argparse.ArgumentTypeError(f"must be in [0, {1 << 30}] bytes, got {n}")
    return n


def build_node(args: argparse.Namespace) -> tuple[ServiceNode, MigrationServicer]:
    """The migration node (ValueError naming the flags of a section it cannot run)."""
    nid = node_id(args, ROLE)
    config: MigrationConfig = MIGRATION_FLAGS.read(args)  # a bad policy, option or transfer is named now
    monitor = LoadMonitor(interval_s=config.load_interval_s)
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
        executor = MigrationExecutor(
            lambda: {k: v.address for k, v in nodes.snapshot().items()},
            max_concurrency=config.max_concurrency,
        )
        coordinator = MigrationCoordinator(
            nid, config.policy, make_migration_policy(config.policy, **config.options),
            make_transfer_planner(config.transfer),
            monitor, nodes, n.etcd, executor, epoch_s=config.epoch_s, election=servicer.election,
            link_bytes_per_s=args.link_bytes_per_s, prefill_tokens_per_epoch=args.prefill_tokens_per_epoch,
            probe_bytes=args.probe_bytes, costs=CostModels(n.etcd),
        )  # fmt: skip
        servicer.coordinator = coordinator
        n.spawn(coordinator.run(), "migration-epochs")
        closers.append(executor.close)

        async def on_elected() -> None:
            log.info("%s is the migration leader", nid)

        async def on_lost() -> None:
            log.warning("%s lost migration leadership", nid)

        n.spawn(servicer.election.run(on_elected, on_lost), "migration-election")

    node.on_etcd.append(attach)

    closers: list = []

    async def cleanup() -> None:
        for close in closers:
            with contextlib.suppress(Exception):
                await close()
        await monitor.close()
        if servicer.election is not None:
            with contextlib.suppress(Exception):
                await servicer.election.resign()

    node.on_stop.append(cleanup)
    return node, servicer


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmfleet-migration", description=__doc__)
    add_common_args(ap, ROLE, default_port=50054)
    MIGRATION_FLAGS.add(ap)
    ap.add_argument(
        "--link-bytes-per-s", type=float, default=1e9,
        help="link bandwidth assumed until a probe or a KV migration over the link measures it (default 1e9)",
    )  # fmt: skip
    ap.add_argument(
        "--probe-bytes", type=probe_size, default=4 << 20,
        help="MeasureLink payload sent once over a link before the first move planned on it "
        "(default 4 MiB; 0: no probes, links learn from finished KV moves only)",
    )  # fmt: skip
    ap.add_argument(
        "--prefill-tokens-per-epoch", type=float, default=2048.0,
        help="re-prefill tokens a destination absorbs per epoch where its model has no cost model "
        "(profiler record or the default cost source); default 2048",
    )  # fmt: skip
    return ap


def main(argv: list[str] | None = None) -> None:
    run_service(ROLE, build_parser(), lambda args: build_node(args)[0], argv)


if __name__ == "__main__":
    main()
