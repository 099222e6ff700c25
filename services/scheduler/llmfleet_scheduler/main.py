"""``llmfleet-scheduler``: the request front door (Submit stream, Cancel, ListServices)."""

from __future__ import annotations

import argparse

from llmfleet.rpc.cli_args import add_common_args, node_id
from llmfleet.rpc.node import ServiceNode, run_service

from llmfleet_scheduler.assembly import (
    ROLE,
    add_http,
    add_loops,
    add_stops,
    attach_views_hook,
    build_parts,
    engines_for,
    grpc_node,
)
from llmfleet_scheduler.flags import (
    add_capacity_flags,
    add_dispatch_flags,
    add_load_flags,
    add_serving_flags,
)
from llmfleet_scheduler.servicer import SchedulerServicer

__all__ = ["ROLE", "build_node", "build_parser", "engines_for", "main"]


def build_node(args: argparse.Namespace) -> tuple[ServiceNode, SchedulerServicer]:
    """The scheduler node and its servicer (ValueError for flags that cannot work together)."""
    nid = node_id(args, ROLE)
    parts = build_parts(args, nid)
    node, readiness = grpc_node(args, nid, parts)
    node.on_etcd.append(attach_views_hook(parts, readiness))
    add_loops(node, args, parts)
    add_http(node, args, parts.servicer)
    add_stops(node, parts)
    return node, parts.servicer


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmfleet-scheduler", description=__doc__)
    add_common_args(ap, ROLE, default_port=50051)
    add_dispatch_flags(ap)
    add_load_flags(ap)
    add_capacity_flags(ap)
    add_serving_flags(ap)
    return ap


def main(argv: list[str] | None = None) -> None:
    # flags that cannot work together (e.g. a load-reading policy, no load) are usage errors
    run_service(ROLE, build_parser(), lambda args: build_node(args)[0], argv)


if __name__ == "__main__":
    main()
