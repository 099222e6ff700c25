"""Argument checks shared by the policy constructors (pure)."""

from __future__ import annotations

from typing import Literal, overload


@overload
def positive_int(name: str, value: object, *, optional: Literal[False] = False) -> int: ...
@overload
def positive_int(name: str, value: object, *, optional: bool) -> int | None: ...
def positive_int(name: str, value: object, *, optional: bool = False) -> int | None:
    """``value`` if it is an int >= 1 (bools refused); None passes when ``optional``."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1{' or None' if optional else ''}, got {value!r}")
    return value
