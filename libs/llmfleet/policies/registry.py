"""Build a policy object from a registry by name, with the same errors for every kind of policy.

A policy with options declares them as a frozen dataclass, its class attribute ``Options``, and takes
that record as its first argument; :func:`instantiate` builds the record from the mapping a cluster
file or a flag gives (its ``__post_init__`` checks the values and names a bad option)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def lookup(kind: str, registry: Mapping[str, T], name: str) -> T:
    """``registry[name]``; an unknown name is a ValueError listing the valid ones."""
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} policy {name!r}; valid: {sorted(registry)}") from None


def check_options(kind: str, registry: Mapping[str, type], name: str, options: Mapping[str, Any]) -> None:
    """Check ``options`` for ``registry[name]`` without building the policy: its options record is built
    (names and values checked), or, for a policy without one, the names are bound to its constructor;
    a ValueError saying which is bad."""
    cls = lookup(kind, registry, name)
    record_type = getattr(cls, "Options", None)
    try:
        if record_type is not None:
            record_type(**options)
        else:
            inspect.signature(cls).bind_partial(**options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad options for {kind} policy {name!r}: {e}") from None


def instantiate(kind: str, registry: Mapping[str, type], name: str, options: Mapping[str, Any]) -> Any:
    """``registry[name]`` with its options record built from ``options`` (``registry[name](**options)``
    for a policy without an ``Options`` record); an unknown name or bad options is a ValueError saying
    which."""
    cls = lookup(kind, registry, name)
    record_type = getattr(cls, "Options", None)
    try:
        return cls(record_type(**options)) if record_type is not None else cls(**options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad options for {kind} policy {name!r}: {e}") from None
