"""pydantic's validation errors as one readable message per key."""

from __future__ import annotations

from pydantic import ValidationError


def validation_message(e: ValidationError) -> str:
    """pydantic's errors as ``where.the.key: what is wrong`` lines (without the input dumps)."""
    lines = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] != "value_error" and not isinstance(err.get("input"), dict | list):
            msg += f", got {err.get('input')!r}"
        lines.append(f"{where}: {msg}" if where else msg)
    return lines[0] if len(lines) == 1 else "\n  " + "\n  ".join(lines)
