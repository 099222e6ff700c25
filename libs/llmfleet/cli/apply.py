"""``llmfleet apply -f FILE``: add or change services (and the models they use) at runtime.

FILE has the cluster file's ``services:`` mapping (name -> model, slo, priority, max_tokens, dispatch,
predict, ...) and optionally its ``models:`` mapping (name -> source, dtype,
sim_model; or a LoRA adapter: base and adapter, its base a checkpoint of FILE or of etcd), checked by the same models as the cluster file (a bad key is named: ``services.qa.slo.ttft_s: Input should
be greater than 0``). A whole cluster file can be applied too: its ``engines:``, ``placement:``,
``migration:``, ``scheduler:`` and ``emulated:`` are bootstrap-only and ignored (with a note).

Every service and model in FILE is created or updated, all in ONE etcd transaction (all or nothing;
it fails rather than overwrite a concurrent change, and is retried on fresh data); services not in
FILE are left alone (delete with ``llmfleet services delete NAME``). ``--dry-run`` prints the changes
without writing. The scheduler routes to a new service at once; the placement leader places its
model on its next tick (planner policies; the static policy serves it only on engines that list the
model); the LoRA engines hosting an adapter's base register the adapter as its entry appears. Exit codes: 0 ok, 1 invalid file or unknown model, 2 etcd unreachable.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmfleet.cli.services import (
    EXIT_OK,
    EXIT_USER,
    UserError,
    add_etcd_arguments,
    read_state,
    run_with_etcd,
)
from llmfleet.coord.desired import ModelEntry, write_desired
from llmfleet.spec.services import ModelConfig, ServiceMap, ServiceSpec
from llmfleet.spec.validation import validation_message

if TYPE_CHECKING:
    from llmfleet.coord.client import EtcdClient

BOOTSTRAP_ONLY = ("engines", "placement", "migration", "scheduler", "emulated")  # sections apply ignores
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # one etcd key component


class ServicesFile(BaseModel):
    """What ``llmfleet apply`` reads: the cluster file's ``services:`` and ``models:`` sections."""

    model_config = ConfigDict(extra="forbid")

    services: ServiceMap
    models: dict[str, ModelConfig] = Field(default_factory=dict)


class ApplyError(UserError):
    """An invalid file or a reference to an unknown model (exit 1)."""


def parse_services_file(text: str, where: str = "FILE") -> tuple[ServicesFile, list[str]]:
    """Parse and validate; returns the file and notes (ignored bootstrap-only sections). Raises
    :class:`ApplyError` with ``where: key.path: what is wrong``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ApplyError(f"{where}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ApplyError(f"{where}: must be a mapping with services: (and optionally models:)")
    notes = [
        f"{where}: ignoring {k}: (bootstrap-only; read by the placement service and llmfleet up)"
        for k in BOOTSTRAP_ONLY
        if k in data
    ]
    data = {k: v for k, v in data.items() if k not in BOOTSTRAP_ONLY}
    try:
        parsed = ServicesFile.model_validate(data)
    except ValidationError as e:
        raise ApplyError(f"{where}: {validation_message(e)}") from None
    for section, names in (("services", parsed.services), ("models", parsed.models)):
        for n in names:
            if not _NAME_RE.match(n):
                raise ApplyError(
                    f"{where}: {section}.{n}: invalid name {n!r}: use letters, digits, '.', '_' and '-' "
                    "(starting with a letter or digit, at most 128)"
                )
    return parsed, notes


def model_entry(name: str, cfg: ModelConfig) -> ModelEntry:
    """The ``models/`` entry of a ``models:`` entry: a checkpoint, or a LoRA adapter (``base`` and its
    directory, an empty source), which the LoRA engines hosting its base register as it appears."""
    return ModelEntry(
        name=name,
        source=cfg.source or "",
        dtype=cfg.dtype,
        sim_model=cfg.sim_model,
        base=cfg.base,
        adapter=cfg.adapter,
    )


def check_adapter_bases(file: ServicesFile, models: dict[str, ModelEntry]) -> None:
    """An adapter entry's base must be a checkpoint entry, of the file or of etcd's catalog."""
    checkpoints = {n for n, m in models.items() if not m.base} | {
        n for n, m in file.models.items() if not m.is_adapter
    }
    checkpoints -= {n for n, m in file.models.items() if m.is_adapter}  # the file replaces etcd's
    for name, cfg in sorted(file.models.items()):
        if cfg.is_adapter and cfg.base not in checkpoints:
            raise ApplyError(
                f"models.{name}: base {cfg.base!r} must be a checkpoint entry (of the file or models/); "
                f"checkpoints: {', '.join(sorted(checkpoints)) or 'none'}"
            )


@dataclass(frozen=True)
class Change:
    kind: str  # "service" | "model"
    name: str
    action: str  # "created" | "updated" | "unchanged"
    details: tuple[str, ...] = ()  # for "updated": "slo.ttft_s: 2 -> 1.5"

    def line(self) -> str:
        more = f": {'; '.join(self.details)}" if self.details else ""
        return f"{self.kind} {self.name} {self.action}{more}"


@dataclass(frozen=True)
class ApplyPlan:
    changes: tuple[Change, ...]
    services: tuple[ServiceSpec, ...]  # to write (created or updated)
    models: tuple[ModelEntry, ...]

    def count(self, action: str) -> int:
        return sum(c.action == action for c in self.changes)

    @property
    def summary(self) -> str:
        return ", ".join(f"{self.count(a)} {a}" for a in ("created", "updated", "unchanged"))


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)


def field_changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, ...]:
    """``key: old -> new`` for every (nested) field of two records that differs."""
    a, b = _flat(old), _flat(new)
    return tuple(
        f"{k}: {_fmt(a.get(k))} -> {_fmt(b.get(k))}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
    )


def _change(kind: str, name: str, old: dict[str, Any] | None, new: dict[str, Any]) -> Change:
    if old is None:
        return Change(kind, name, "created")
    details = field_changes(old, new)
    return Change(kind, name, "updated" if details else "unchanged", details)


def plan_apply(
    file: ServicesFile, services: dict[str, ServiceSpec], models: dict[str, ModelEntry]
) -> ApplyPlan:
    """What applying ``file`` over etcd's ``services`` and ``models`` changes (pure). Raises
    :class:`ApplyError` naming a service whose model is declared neither in the file nor in etcd."""
    known = set(models) | set(file.models)
    for name, svc in file.services.items():
        if svc.model not in known:
            raise ApplyError(
                f"services.{name}.model: unknown model {svc.model!r}; declare it under models: "
                f"(known: {', '.join(sorted(known)) or 'none'})"
            )
    check_adapter_bases(file, models)
    changes: list[Change] = []
    write_m: list[ModelEntry] = []
    write_s: list[ServiceSpec] = []
    for name, cfg in sorted(file.models.items()):
        new = model_entry(name, cfg)
        old = models.get(name)
        c = _change("model", name, None if old is None else asdict(old), asdict(new))
        changes.append(c)
        if c.action != "unchanged":
            write_m.append(new)
    for name, spec in sorted(file.services.items()):
        current = services.get(name)
        c = _change("service", name, None if current is None else current.to_dict(), spec.to_dict())
        changes.append(c)
        if c.action != "unchanged":
            write_s.append(spec)
    return ApplyPlan(tuple(changes), tuple(write_s), tuple(write_m))


async def _apply(client: EtcdClient, args: argparse.Namespace, file: ServicesFile) -> int:
    for _ in range(3):
        st = await read_state(client)
        plan = plan_apply(file, st.services, st.models)
        if args.dry_run or not (plan.services or plan.models):
            break
        if await write_desired(client, plan.services, plan.models, unchanged_since=st.revision):
            break
    else:
        raise ApplyError("services/ kept changing under us (another apply?); nothing written, try again")
    for c in plan.changes:
        print(c.line())
    if args.dry_run:
        print(f"dry run: {plan.summary}; nothing written")
    else:
        print(f"applied: {plan.summary}")
        if not st.seeded:
            print(
                "note: no placement leader has seeded services/ from its cluster file yet; when one does it "
                "adds only the services and models etcd lacks",
                file=sys.stderr,
            )
    return EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--file", required=True, help="YAML with services: (and optionally models:)")
    p.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    add_etcd_arguments(p)


def run(args: argparse.Namespace) -> int:
    try:
        with open(args.file) as f:
            text = f.read()
        file, notes = parse_services_file(text, args.file)
    except OSError as e:
        print(f"error: cannot read {args.file}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USER
    except ApplyError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    return run_with_etcd(args, lambda client: _apply(client, args, file))
