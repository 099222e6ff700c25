"""``llmfleet services``: list, describe and delete the services in etcd (``services/``).

  llmfleet services list                 name, model, SLO, priority and the engines hosting each
  llmfleet services describe NAME        the spec, its model and where it is placed (YAML; --json)
  llmfleet services delete NAME          remove it: the scheduler stops routing to it at once
                                         (NOT_FOUND) and the placement leader releases its model

Add or change services with ``llmfleet apply -f FILE``. Exit codes: 0 ok, 1 user error (unknown
service), 2 etcd unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from llmfleet.config import EtcdSettings
from llmfleet.coord.client import EtcdClient, EtcdError, EtcdUnavailable
from llmfleet.coord.desired import ModelEntry, write_desired
from llmfleet.coord.keys import Keys
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, NodeRecord

EXIT_OK, EXIT_USER, EXIT_ETCD = 0, 1, 2


class UserError(Exception):
    """A mistake of the caller's (exit 1), with the message to print."""


# -- etcd access shared with `llmfleet apply` ----------------------------------------------------------


def add_etcd_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--etcd", default=None, help="etcd endpoints host:port[,host:port] (env LLMFLEET_ETCD)")
    p.add_argument("--prefix", default=None, help="etcd key prefix (env LLMFLEET_PREFIX, default /llmfleet)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for etcd")


def etcd_settings(args: argparse.Namespace) -> EtcdSettings:
    settings = EtcdSettings.from_env(endpoints=args.etcd, prefix=args.prefix)
    settings.timeout_s = args.timeout
    return settings


def run_with_etcd(args: argparse.Namespace, body: Callable[[EtcdClient], Any]) -> int:
    """Connect, run ``await body(client)`` (its int is the exit code), close; map failures to exit
    codes with one clear line on stderr: UserError 1, etcd unreachable 2 (naming the endpoints)."""
    settings = etcd_settings(args)

    async def main() -> int:
        client = EtcdClient(settings)
        try:
            # try again until --timeout: a loaded machine can miss one probe's 2 s handshake
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(EtcdUnavailable),
                stop=stop_after_delay(settings.timeout_s),
                wait=wait_fixed(0.2),
                reraise=True,
            ):
                with attempt:
                    await asyncio.wait_for(client.connect(wait=False), settings.timeout_s)
            return int(await body(client))
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER
    except (EtcdError, TimeoutError, OSError) as e:
        print(
            f"error: cannot reach etcd at {','.join(settings.endpoints)} "
            f"(prefix {settings.prefix}): {e or type(e).__name__}",
            file=sys.stderr,
        )
        return EXIT_ETCD


# -- what etcd says ------------------------------------------------------------------------------------


@dataclass
class ServicesState:
    """``services/``, ``models/``, ``placement/`` and the engines' loaded models at one read."""

    services: dict[str, ServiceSpec] = field(default_factory=dict)
    models: dict[str, ModelEntry] = field(default_factory=dict)
    placements: dict[str, DesiredPlacement] = field(default_factory=dict)
    loaded: dict[str, tuple[str, ...]] = field(default_factory=dict)  # engine id -> models loaded
    revision: int = 0  # the etcd revision services/ and models/ were read at
    seeded: bool = False
    errors: list[str] = field(default_factory=list)  # undecodable keys

    def placed_on(self, model: str) -> list[str]:
        return sorted(e for e, p in self.placements.items() if any(m.name == model for m in p.models))

    def loaded_on(self, model: str) -> list[str]:
        return sorted(e for e, models in self.loaded.items() if model in models)


def decode_state(
    keys: Keys,
    services: dict[str, bytes],
    models: dict[str, bytes],
    placements: dict[str, bytes],
    nodes: dict[str, bytes],
    revision: int = 0,
    seeded: bool = False,
) -> ServicesState:
    """Raw prefix reads (full key -> value) -> :class:`ServicesState`; bad values become ``errors``."""
    st = ServicesState(revision=revision, seeded=seeded)
    for raw_map, target, decode in (
        (services, st.services, ServiceSpec.from_json),
        (models, st.models, ModelEntry.from_json),
        (placements, st.placements, DesiredPlacement.from_json),
    ):
        for key, raw in raw_map.items():
            try:
                target[keys.leaf(key)] = decode(raw)
            except (ValueError, TypeError, KeyError) as e:
                st.errors.append(f"{key}: {e}")
    for raw in nodes.values():
        try:
            rec = NodeRecord.from_json(raw)
        except (ValueError, TypeError, KeyError):
            continue
        if rec.role == ENGINE_ROLE:
            st.loaded[rec.node_id] = tuple(rec.models)
    return st


async def read_state(client: EtcdClient) -> ServicesState:
    keys = client.keys
    (svc, rev), (mod, _), (place, _), (nodes, _), seeded = await asyncio.gather(
        client.get_prefix(keys.services),
        client.get_prefix(keys.models),
        client.get_prefix(keys.placements),
        client.get_prefix(keys.nodes),
        client.get(keys.services_seeded),
    )
    return decode_state(keys, svc, mod, place, nodes, rev, seeded is not None)


# -- rendering -----------------------------------------------------------------------------------------


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def service_rows(st: ServicesState) -> list[dict[str, Any]]:
    rows = []
    for name, s in sorted(st.services.items()):
        rows.append(
            {
                "name": name,
                "model": s.model,
                "ttft_s": s.slo.ttft_s,
                "tpot_s": s.slo.tpot_s,
                "deadline_s": s.slo.deadline_s,
                "priority": s.priority,
                "placed_on": st.placed_on(s.model),
                "loaded_on": st.loaded_on(s.model),
            }
        )
    return rows


def render_table(st: ServicesState) -> str:
    header = ("NAME", "MODEL", "TTFT_S", "TPOT_S", "DEADLINE_S", "PRIORITY", "ENGINES")
    rows = [
        (
            r["name"],
            r["model"],
            _num(r["ttft_s"]),
            _num(r["tpot_s"]),
            _num(r["deadline_s"]),
            str(r["priority"]),
            ",".join(r["placed_on"]) or "unplaced",
        )
        for r in service_rows(st)
    ]
    widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in (header, *rows)
    ]
    if not rows:
        lines.append("(no services)")
    for e in st.errors:
        lines.append(f"warning: undecodable {e}")
    return "\n".join(lines)


def describe(st: ServicesState, name: str) -> dict[str, Any]:
    spec = st.services.get(name)
    if spec is None:
        raise UserError(f"no service {name!r} (known: {', '.join(sorted(st.services)) or 'none'})")
    svc = spec.to_dict()
    svc.pop("name")
    model = st.models.get(spec.model)
    return {
        "name": name,
        "service": svc,
        "model": {k: v for k, v in asdict(model).items() if k != "name"} if model else None,
        "placed_on": st.placed_on(spec.model),
        "loaded_on": st.loaded_on(spec.model),
    }


# -- commands ------------------------------------------------------------------------------------------


async def _list(client: EtcdClient, args: argparse.Namespace) -> int:
    st = await read_state(client)
    if args.json:
        print(json.dumps(service_rows(st), indent=2, sort_keys=True))
    else:
        print(render_table(st))
    return EXIT_OK


async def _describe(client: EtcdClient, args: argparse.Namespace) -> int:
    doc = describe(await read_state(client), args.name)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(yaml.safe_dump(doc, sort_keys=False).rstrip())
    return EXIT_OK


async def _delete(client: EtcdClient, args: argparse.Namespace) -> int:
    for _ in range(3):
        st = await read_state(client)
        spec = st.services.get(args.name)
        if spec is None:
            describe(st, args.name)  # raises the "no service" UserError
        # only if nobody changed it since we read it (else read again)
        if await write_desired(client, delete_services=[args.name], unchanged_since=st.revision):
            users = sorted(n for n, s in st.services.items() if s.model == spec.model and n != args.name)
            still = f"; model {spec.model} still serves {', '.join(users)}" if users else ""
            print(f"service {args.name} deleted (model {spec.model}){still}")
            return EXIT_OK
    raise UserError(f"service {args.name!r} kept changing while deleting it; try again")


SUBCOMMANDS: dict[str, Callable[[EtcdClient, argparse.Namespace], Awaitable[int]]] = {
    "list": _list,
    "describe": _describe,
    "delete": _delete,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="services_command", metavar="SUBCOMMAND", required=True)
    ls = sub.add_parser("list", help="the services, their SLOs and the engines hosting them")
    add_etcd_arguments(ls)
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    desc = sub.add_parser("describe", help="one service's spec, model and placement (YAML)")
    desc.add_argument("name")
    add_etcd_arguments(desc)
    desc.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    rm = sub.add_parser("delete", help="delete a service (exit 1 if there is none by that name)")
    rm.add_argument("name")
    add_etcd_arguments(rm)


def run(args: argparse.Namespace) -> int:
    command = SUBCOMMANDS[args.services_command]
    return run_with_etcd(args, lambda client: command(client, args))
