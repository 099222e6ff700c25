"""Build a policy object from a registry by name, with the same errors for every kind of policy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def lookup(kind: str, registry: Mapping[str, T], name: str) -> T:
    """``registry[name]``; an unknown name is a ValueError listing the valid ones."""
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} policy {name!r}; valid: {sorted(registry)}") from None


def instantiate(kind: str, registry: Mapping[str, type], name: str, options: Mapping[str, Any]) -> Any:
    """``registry[name](**options)``; an unknown name or bad options is a ValueError saying which."""
    cls = lookup(kind, registry, name)
    try:
        return cls(**options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad options for {kind} policy {name!r}: {e}") from None
