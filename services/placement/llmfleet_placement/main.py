"""``llmfleet-placement``: leader-elected placement controller (config or planner -> desired state in etcd).

``--policy static`` (the default of a config without ``placement:``) copies the config's ``engines:``
into etcd; any planner of ``llmfleet.policies.placement`` runs every ``--interval-s`` over the
monitored workload and the live engine pool (``live.LivePlacementLoop``).

The config's ``services:`` and ``models:`` are a bootstrap: the first leader seeds etcd's ``services/``
and ``models/`` from them once; afterwards etcd is the truth (``llmfleet apply``, ``llmfleet
services``) and runtime changes are never reverted; ``--reseed`` replaces them with the config's
(``controller`` module docstring)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from llmfleet.api.v1 import placement_pb2, placement_pb2_grpc
from llmfleet.config import DEFAULT_CONFIG, ClusterConfig
from llmfleet.coord import LeaderElection, PrefixView, node_view, placement_view, service_view
from llmfleet.policies.placement import PlacementPlanner, make_placement_policy
from llmfleet.policies.placement.evaluator import PlanEvaluatorFactory
from llmfleet.rpc.cli_args import add_common_args, etcd_settings, node_id
from llmfleet.rpc.node import ServiceNode, run_service
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.spec.live_loops import PLACEMENT_FLAGS
from llmfleet.types import DesiredPlacement, NodeRecord

from llmfleet_placement.controller import PlacementController, read_runtime_config
from llmfleet_placement.live import LivePlacementLoop
from llmfleet_placement.servicer import PlacementServicer
from llmfleet_placement.workload import MonitorWorkload

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
        planned = config.placement.planned
        controller = PlacementController(
            config,
            n.etcd,
            *views,
            resync_s=args.resync_s,
            manage_placement=not planned,
            reseed=args.reseed,
            config_path=args.config,
            leader_id=nid,
            election=servicer.election,
        )
        tasks: list[asyncio.Task] = []

        async def on_elected() -> None:
            log.info("%s is the placement leader (policy %s)", nid, config.placement.policy)
            tasks.append(asyncio.create_task(controller.run()))
            if planned:
                loop = live_loop(config, n, servicer, views[0], views[2])
                tasks.append(asyncio.create_task(loop.run()))

        async def on_lost() -> None:
            log.warning("%s lost placement leadership", nid)
            while tasks:
                tasks.pop().cancel()

        servicer.views = views
        n.spawn(servicer.election.run(on_elected, on_lost), "placement-election")

    node.on_etcd.append(lead)
    node.on_stop.append(servicer.shutdown)
    return node, servicer


def live_loop(
    config: ClusterConfig,
    n: ServiceNode,
    servicer: PlacementServicer,
    placements: PrefixView[DesiredPlacement],
    nodes: PrefixView[NodeRecord],
) -> LivePlacementLoop:
    """A planner loop for a new term (fresh hysteresis; it adopts the plan in etcd), reading the
    service monitor the schedulers feed and logging its decisions on the servicer."""
    p = config.placement
    planner = make_placement_policy(p.policy, **p.options)
    return LivePlacementLoop(
        config,
        n.etcd,
        placements,
        nodes,
        planner=planner,
        policy=p.policy,
        interval_s=p.interval_s,
        leader_id=n.node_id,
        workload=MonitorWorkload(
            servicer.monitor, config.service_specs, p.window_s, config, plan_evaluators(planner, p.policy)
        ),
        decisions=servicer.decisions,
        wake=servicer.demand,
        election=servicer.election,
        clock=time.monotonic,  # the monitor's clock (the servicer feeds it on time.monotonic)
        desired=lambda: read_runtime_config(n.etcd, config),  # etcd's services/, every tick
    )


def plan_evaluators(planner: PlacementPlanner, policy: str) -> PlanEvaluatorFactory | None:
    """The simulator scoring candidate plans, for a planner that needs one (SeaLLM): the one place this
    service reaches the simulator, and only through the ``PlanEvaluatorFactory`` interface (imported
    on demand: other planners never load it)."""
    if not planner.needs.evaluator:
        return None
    from llmfleet.sim.plan_eval import ClusterPlanEvaluators  # the simulator and scipy: only for this planner

    return ClusterPlanEvaluators(policy)


def apply_flags(config: ClusterConfig, args: argparse.Namespace) -> ClusterConfig:
    """The placement flags given over the config's ``placement:`` (a policy the flags change drops
    the config's options: they belong to the config's policy); ValueError naming a flag it refuses."""
    p = config.placement
    given = PLACEMENT_FLAGS.given(args)
    if not given:
        return config
    if given.get("policy", p.policy) != p.policy and "options" not in given:
        p = p.model_copy(update={"options": {}})
    placement = PLACEMENT_FLAGS.read(args, base=p)
    return ClusterConfig.model_validate({**config.model_dump(), "placement": placement.model_dump()})


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmfleet-placement", description=__doc__)
    add_common_args(ap, ROLE, default_port=50053)
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="cluster config (services -> models -> engines)")
    ap.add_argument("--resync-s", type=float, default=5.0, help="periodic full reconcile interval")
    ap.add_argument(
        "--reseed",
        action="store_true",
        help="replace etcd's services/ and models/ with the config's when this process first leads "
        "(default: seed them only if etcd was never seeded; runtime changes are kept)",
    )
    PLACEMENT_FLAGS.add(ap)
    return ap


def main(argv: list[str] | None = None) -> None:
    def build(args: argparse.Namespace) -> ServiceNode:
        try:
            config = apply_flags(ClusterConfig.load(args.config), args)
            config.check_live()
        except ValueError as e:  # pydantic ValidationError is a ValueError
            raise SystemExit(f"llmfleet-placement: invalid config {args.config}: {e}") from None
        return build_node(args, config)[0]

    run_service(ROLE, build_parser(), build, argv)


if __name__ == "__main__":
    main()
