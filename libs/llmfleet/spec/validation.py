"""pydantic's validation errors as one readable message per key."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError


def _dotted(loc: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in loc)


def validation_message(e: ValidationError, where: Callable[[tuple[str | int, ...]], str] = _dotted) -> str:
    """pydantic's errors as ``where.the.key: what is wrong`` lines (without the input dumps);
    ``where`` names the key at an error's location (a command line: its flag)."""
    lines = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] != "value_error" and not isinstance(err.get("input"), dict | list):
            msg += f", got {err.get('input')!r}"
        lines.append(f"{where(err['loc'])}: {msg}" if err["loc"] else msg)
    return lines[0] if len(lines) == 1 else "\n  " + "\n  ".join(lines)
