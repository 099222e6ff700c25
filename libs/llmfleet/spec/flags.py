"""Command-line flags generated from a spec section, so that a setting, its default and its help text
are written once: in the section's field (``Field(default, description=...)``).

:class:`SectionFlags` turns each field of a pydantic section into one flag: ``--kebab-name`` (or the
spelling ``names`` gives it), its type and constraints checked by the field's own annotation (a bad
value is a usage error naming the flag), a ``Literal`` as ``choices``, a ``bool`` as ``--x`` /
``--no-x``, a mapping or a nested record as one JSON object, the field's default and its description
as the help. A nested section expands into its own fields (``dispatch.policy`` -> ``--dispatch-policy``)
unless it is passed ``whole`` as JSON. The same object reads the parsed flags back into the section
(:meth:`SectionFlags.read`, errors naming the flags) and writes a section as the command line that
gives it (:meth:`SectionFlags.argv`, what ``llmfleet up`` passes each service).

With ``overrides=True`` every flag defaults to None: only the flags given change a section read
elsewhere (a cluster file, a preset), and the help names the key they override.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from llmfleet.spec.validation import validation_message

_NONE = type(None)


def json_object(text: str) -> dict[str, Any]:
    """An argparse ``type``: a JSON object, else a usage error saying why."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def _inner(annotation: Any) -> Any:
    """``X | None`` -> ``X`` (a flag that is not given is the None)."""
    if get_origin(annotation) in (Union, type(int | None)):
        members = [a for a in get_args(annotation) if a is not _NONE]
        if len(members) == 1:
            return members[0]
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _is_json(annotation: Any) -> bool:
    """A value the command line carries as one JSON object (a mapping or a whole record)."""
    return _is_model(annotation) or get_origin(annotation) is dict or annotation is dict


@dataclass(frozen=True)
class Flag:
    """One field of a section as a flag: its path in the section, its option and the field."""

    path: tuple[str, ...]
    option: str
    info: FieldInfo
    default: Any  # the field's default in the section (a nested section's own value)

    @property
    def key(self) -> str:
        """The field's key, as a cluster file writes it (``dispatch.policy``)."""
        return ".".join(self.path)

    @property
    def dest(self) -> str:
        return self.option.removeprefix("--").replace("-", "_")

    @cached_property
    def annotation(self) -> Any:
        return _inner(self.info.annotation)

    @property
    def is_bool(self) -> bool:
        return self.annotation is bool

    def parse(self, text: str) -> Any:
        """An argparse ``type``: the text checked by the field's annotation and constraints."""
        value: Any = json_object(text) if _is_json(self.annotation) else text
        try:
            return self._adapter.validate_python(value)
        except ValidationError as e:
            raise argparse.ArgumentTypeError(validation_message(e)) from None

    @cached_property
    def _adapter(self) -> TypeAdapter[Any]:
        form: Any = Annotated[self.annotation, *self.info.metadata] if self.info.metadata else self.annotation
        return TypeAdapter(form)

    def text(self, value: Any) -> list[str]:
        """The command line that gives ``value`` (empty for None)."""
        if value is None:
            return []
        if self.is_bool:
            return [self.option if value else "--no-" + self.option.removeprefix("--")]
        if isinstance(value, BaseModel):
            return [self.option, value.model_dump_json(exclude_defaults=True)]
        if isinstance(value, dict):
            return [self.option, json.dumps(value, sort_keys=True)]
        return [self.option, str(value)]


@dataclass(frozen=True)
class SectionFlags:
    """The flags of one spec section. ``names``: field key -> flag (without dashes) where it is not
    the field's own name; for a nested section's key, the prefix of its fields' flags (``""``: none).
    ``skip``: keys that are no flag (set by the caller, or flags of their own); ``whole``: nested
    sections passed as one JSON object; ``overrides``: flags default to None and change only what
    they give (the help names the key, under ``key``: the section's key in the cluster file);
    ``title``: the argument group in ``--help``."""

    section: type[BaseModel]
    names: Mapping[str, str] = field(default_factory=dict)
    skip: Collection[str] = ()
    whole: Collection[str] = ()
    overrides: bool = False
    key: str = ""
    title: str | None = None

    @cached_property
    def flags(self) -> tuple[Flag, ...]:
        return tuple(self._walk(self.section, (), "", None))

    def _walk(self, model: type[BaseModel], path: tuple[str, ...], prefix: str, base: Any) -> Any:
        for name, info in model.model_fields.items():
            sub = (*path, name)
            key = ".".join(sub)
            if key in self.skip:
                continue
            default = info.get_default(call_default_factory=True) if base is None else getattr(base, name)
            if _is_model(_inner(info.annotation)) and key not in self.whole:
                sub_prefix = self.names.get(key, prefix + name.replace("_", "-"))
                yield from self._walk(
                    _inner(info.annotation), sub, sub_prefix + "-" if sub_prefix else "", default
                )
            else:
                yield Flag(sub, "--" + self.names.get(key, prefix + name.replace("_", "-")), info, default)

    def option(self, key: str) -> str:
        """The flag of field ``key``."""
        return next(f.option for f in self.flags if f.key == key)

    def add(self, parser: argparse.ArgumentParser) -> None:
        """Add the flags to ``parser`` (in the ``title`` group)."""
        group = parser.add_argument_group(self.title) if self.title else parser
        for f in self.flags:
            kw: dict[str, Any] = {"default": None if self.overrides else f.default, "help": self._help(f)}
            if f.is_bool:
                kw["action"] = argparse.BooleanOptionalAction
            elif get_origin(f.annotation) is Literal:
                kw["choices"] = get_args(f.annotation)
            else:
                kw["type"] = _typed(f)
                kw["metavar"] = "JSON" if _is_json(f.annotation) else None
            group.add_argument(f.option, **kw)

    def _help(self, f: Flag) -> str:
        text = (f.info.description or f.key).replace("%", "%%")
        if self.overrides:
            return f"{text} (overrides {'.'.join(filter(None, (self.key, f.key)))})"
        shown = f.default.model_dump(exclude_defaults=True) if isinstance(f.default, BaseModel) else f.default
        return text if shown in (None, {}, []) else f"{text} (default: {_shown(shown)})"

    def given(self, ns: argparse.Namespace) -> dict[str, Any]:
        """The values the flags set, nested as the section holds them: with ``overrides`` the flags
        given, else those that differ from the section's defaults."""
        out: dict[str, Any] = {}
        for path, value in self._set(ns):
            where = out
            for part in path[:-1]:
                where = where.setdefault(part, {})
            where[path[-1]] = value
        return out

    def _set(self, ns: argparse.Namespace) -> list[tuple[tuple[str, ...], Any]]:
        values = ((f, getattr(ns, f.dest)) for f in self.flags)
        return [(f.path, v) for f, v in values if v is not None and (self.overrides or v != f.default)]

    def read(self, ns: argparse.Namespace, base: BaseModel | None = None, **fixed: Any) -> Any:
        """The section the flags give (over ``base``, with ``fixed`` fields the caller sets);
        ValueError naming the flags of a setting it refuses."""
        data = base.model_dump() if base is not None else {}
        for path, value in self._set(ns):
            where = data
            for part in path[:-1]:
                where = where.setdefault(part, {})
            where[path[-1]] = value
        try:
            return self.section.model_validate({**data, **fixed})
        except ValidationError as e:
            raise ValueError(validation_message(e, where=self._where)) from None

    def _where(self, loc: tuple[str | int, ...]) -> str:
        """The flags of the field at ``loc`` (a nested section: all of its flags)."""
        options = [f.option for f in self.flags if f.path[: len(loc)] == loc]
        return ", ".join(options) if options else ".".join(str(p) for p in loc)

    def argv(self, section: BaseModel, *, only: Collection[str] | None = None) -> list[str]:
        """The flags that give ``section`` (its None fields and empty mappings left out); ``only``:
        these keys."""
        out: list[str] = []
        for f in self.flags:
            if only is not None and f.key not in only:
                continue
            value: Any = section
            for part in f.path:
                value = getattr(value, part)
            if value != {}:
                out += f.text(value)
        return out


def _typed(f: Flag) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return f.parse(text)

    parse.__name__ = f.dest  # argparse's "invalid <name> value" (unused: errors are ArgumentTypeError)
    return parse


def _shown(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else str(value)
