"""Expose a part's public attribute on the object built from it (the executor's API over its parts)."""

from __future__ import annotations

from typing import Any


class Via:
    """A class attribute ``name = Via("part")``: ``obj.name`` reads ``obj.part.name`` (a method comes back
    bound to the part, a property is evaluated on it)."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.part), self.name)
