"""``llmfleet``: run and inspect an llmfleet cluster.

Each subcommand lives in its own module exposing ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int`` (the exit code); add a module to ``COMMANDS`` to add a subcommand.
"""

from __future__ import annotations

import argparse
import logging
import sys
from types import ModuleType

from llmfleet.cli import apply, certs, compare, load, services, sim, status, submit, up

COMMANDS: tuple[ModuleType, ...] = (up, status, submit, load, sim, compare, apply, services, certs)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmfleet", description="Run and inspect an llmfleet cluster.")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS:
        p = sub.add_parser(
            cmd.NAME,
            help=cmd.HELP,
            description=(cmd.__doc__ or cmd.HELP).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level={0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
