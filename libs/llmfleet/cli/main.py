"""``llmfleet``: run and inspect an llmfleet cluster.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``
(the exit code); its docstring is the subcommand's description. ``COMMANDS`` maps each subcommand to
its module and one-line help; add an entry to add a subcommand.

The command line loads only the module of the subcommand it runs: ``llmfleet status`` does not pay for
the simulator's imports, nor ``llmfleet --help`` for any.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Collection, Sequence
from types import ModuleType
from typing import NamedTuple


class Command(NamedTuple):
    module: str
    help: str


COMMANDS: dict[str, Command] = {
    "up": Command(
        "llmfleet.cli.up", "start etcd, the control plane and the engines locally; Ctrl-C stops everything"
    ),
    "status": Command(
        "llmfleet.cli.status",
        "show nodes, services, placement, leaders, the engine pool and placement decisions",
    ),
    "submit": Command("llmfleet.cli.submit", "submit a prompt to the scheduler and stream the completion"),
    "load": Command(
        "llmfleet.cli.load",
        "send Poisson load to services phase by phase and report latency and the engines used",
    ),
    "sim": Command(
        "llmfleet.cli.sim",
        "simulate a workload on a cluster with the shipped policies (and compare policies)",
    ),
    "compare": Command(
        "llmfleet.cli.compare",
        "compare two reports (llmfleet sim / llmfleet load): a table, placement plans and GPUs in use",
    ),
    "apply": Command(
        "llmfleet.cli.apply", "add or change services (and their models) at runtime from a YAML file"
    ),
    "services": Command(
        "llmfleet.cli.services",
        "list, describe or delete the services in etcd (add or change them with `llmfleet apply`)",
    ),
    "certs": Command("llmfleet.cli.certs", "make a development CA and certificate for TLS"),
}


def command_module(name: str) -> ModuleType:
    """The module of subcommand ``name``, imported on first use (the CLI's one lazy import)."""
    return importlib.import_module(COMMANDS[name].module)


def build_parser(load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand; the arguments of those in ``load`` (all when None) are defined,
    the others are listed with their help only."""
    ap = argparse.ArgumentParser(prog="llmfleet", description="Run and inspect an llmfleet cluster.")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, cmd in COMMANDS.items():
        if load is not None and name not in load:
            sub.add_parser(name, help=cmd.help)
            continue
        module = command_module(name)
        p = sub.add_parser(
            name,
            help=cmd.help,
            description=(module.__doc__ or cmd.help).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
    return ap


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: its first word that is not an option (the top-level
    options take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name = chosen_command(argv)
    args = build_parser(load=[name] if name is not None and name in COMMANDS else []).parse_args(argv)
    logging.basicConfig(
        level={0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(command_module(args.command).run(args))


if __name__ == "__main__":
    sys.exit(main())
