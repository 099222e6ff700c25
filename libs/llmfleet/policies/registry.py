"""Build a policy object from a registry by name, with the same errors for every kind of policy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def instantiate(kind: str, registry: Mapping[str, type], name: str, options: Mapping[str, Any]) -> Any:
    """``registry[name](**options)``; an unknown name or bad options is a ValueError saying which."""
    try:
        cls = registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} policy {name!r}; valid: {sorted(registry)}") from None
    try:
        return cls(**options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad options for {kind} policy {name!r}: {e}") from None
