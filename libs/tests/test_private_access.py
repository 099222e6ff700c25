"""The private-access checker (``tools.lint.private_access``) on small in-memory modules."""

from __future__ import annotations

import textwrap

from tools.lint.private_access import Hit, find_hits, is_private

OWNER = """
from dataclasses import dataclass

@dataclass
class Point:
    x: int
    _tag: str = ""

class Counter:
    __slots__ = ("_slot",)

    def __init__(self) -> None:
        self._n = 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Counter) and other._n == self._n and other._slot == self._slot

    @classmethod
    def at(cls, n: int) -> "Counter":
        c = cls()
        c._n = n
        cls._made = True
        return c

    def _bump(self) -> None:
        self._n += 1

def tagged(p: Point) -> str:
    return p._tag + str(Counter.at(1)._bump())
"""

USER = """
from owner import Counter, _helper

def peek(c: Counter) -> int:
    c._bump()
    getattr(c, "_n")
    setattr(c, "_n", 2)
    monkeypatch.setattr("owner._helper", None)
    return c._n
"""


def hits(source: str) -> list[Hit]:
    return find_hits(textwrap.dedent(source), "sample.py")


def test_the_owning_module_may_use_its_private_names():
    assert hits(OWNER) == []


def test_another_module_reading_or_writing_a_private_name_is_reported():
    assert [(h.line, h.name) for h in hits(USER)] == [
        (2, "import _helper"),
        (5, "_bump"),
        (6, "_n"),
        (7, "_n"),
        (8, "_helper"),
        (9, "_n"),
    ]
    assert str(hits(USER)[0]) == "sample.py:2: import _helper"


def test_self_and_dunders_are_not_private_uses():
    assert hits("class A:\n    def f(self, o):\n        return self._x, o.__dict__, o._\n") == []
    assert is_private("_x") and not is_private("__eq__") and not is_private("x")
