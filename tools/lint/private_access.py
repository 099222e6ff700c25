"""Reports each place that uses another module's private name, and exits 1 when there is any.

Run from the repository root as ``python -m tools.lint.private_access [path ...]`` (``make lint``); with
no path it reads every ``.py`` file under libs, services, tools and integration_tests, except the
generated gRPC stubs. It prints each place as ``path:line: name`` and then the total.

A private name starts with one underscore (``_x``; not a dunder such as ``__eq__``). A module owns
``_x`` when one of its classes defines it: a method, a class attribute or dataclass field, an entry
of ``__slots__``, or an assignment ``self._x = ...`` / ``cls._x = ...`` in one of its methods. The
checker reports:

- ``obj._x`` (read, write or delete) where ``_x`` is not owned by the module; ``self._x`` and
  ``cls._x`` are always allowed, and so is ``other._x`` where the module owns ``_x`` (``__eq__``, a
  classmethod building an instance);
- ``getattr``, ``setattr``, ``hasattr`` and ``delattr`` with a private name not owned by the module,
  including their test doubles ``monkeypatch.setattr(obj, "_x", ...)`` and ``patch.object(obj, "_x")``;
- a dotted target such as ``patch("a.b._x")`` or ``monkeypatch.setattr("a.b._x", ...)``;
- ``from a.b import _x``.

Private names of third-party packages with no public equivalent are allowed where ``THIRD_PARTY``
lists them, each with its reason.

A module-level name of the module does not make ``obj._x`` owned: the module's own names are used by
name, and ``obj._x`` on a module object is another module's name. Ownership is by name, not by type:
``other._x`` passes when some class of the module defines ``_x``, whichever class ``other`` is.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOTS = ("libs", "services", "tools", "integration_tests")
GENERATED = (Path("libs/llmfleet/api/v1"),)  # gRPC stubs written by tools/gen_protos.py
SELF_NAMES = frozenset({"self", "cls"})
_TRACER_RESET = "opentelemetry has no public way to uninstall its global TracerProvider (tests reset it)"
# Private names of third-party packages that have no public equivalent, by the file that uses them
# and why; an entry here is the only way to do what that file does.
THIRD_PARTY: dict[tuple[str, str], str] = {
    ("libs/llmfleet/telemetry/__init__.py", "_TRACER_PROVIDER"): _TRACER_RESET,
    ("libs/llmfleet/telemetry/__init__.py", "_TRACER_PROVIDER_SET_ONCE"): _TRACER_RESET,
}
NAME_CALLS = frozenset({"getattr", "setattr", "hasattr", "delattr", "object"})  # (obj, "_x", ...)
TARGET_CALLS = frozenset({"patch", "setattr", "delattr"})  # ("a.b._x", ...)


@dataclass(frozen=True)
class Hit:
    """One use of another module's private name."""

    path: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name}"


def is_private(name: str) -> bool:
    """True for ``_x``; False for public names and dunders."""
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _target_names(target: ast.expr) -> Iterator[str]:
    """The plain names an assignment target binds (``a``, ``a, b``)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for elt in target.elts:
            yield from _target_names(elt)


def _slots(value: ast.expr) -> Iterator[str]:
    """The string entries of a ``__slots__`` value."""
    if isinstance(value, ast.Tuple | ast.List | ast.Set):
        for elt in value.elts:
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                yield elt.value


def _class_body_names(cls: ast.ClassDef) -> Iterator[str]:
    """Methods, nested classes, class attributes, dataclass fields and ``__slots__`` of ``cls``."""
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield stmt.name
        elif isinstance(stmt, ast.AnnAssign):
            yield from _target_names(stmt.target)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                names = list(_target_names(target))
                yield from names
                if "__slots__" in names:
                    yield from _slots(stmt.value)


def _self_assigned(cls: ast.ClassDef) -> Iterator[str]:
    """Attributes assigned as ``self._x = ...`` or ``cls._x = ...`` anywhere inside ``cls``."""
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in SELF_NAMES
        ):
            yield node.attr


def owned_names(tree: ast.Module) -> set[str]:
    """The private names the classes of ``tree`` define."""
    owned: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            owned.update(_class_body_names(node))
            owned.update(_self_assigned(node))
    return {name for name in owned if is_private(name)}


def _call_name(func: ast.expr) -> str | None:
    """``f`` for ``f(...)`` and ``a.b.f(...)``."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _string(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in SELF_NAMES


def _call_private_names(call: ast.Call) -> Iterator[str]:
    """The private names a ``getattr``-like call or a dotted patch target names."""
    name = _call_name(call.func)
    args = call.args
    if name in NAME_CALLS and len(args) >= 2 and not _is_self(args[0]):
        attr = _string(args[1])
        if attr is not None and is_private(attr):
            yield attr
    if name in TARGET_CALLS and args:
        target = _string(args[0])
        if target is not None and "." in target and is_private(target.rsplit(".", 1)[1]):
            yield target.rsplit(".", 1)[1]


def _node_private_names(node: ast.AST) -> Iterator[str]:
    """The private names ``node`` uses on an object other than ``self``/``cls``, or imports."""
    if isinstance(node, ast.Attribute) and is_private(node.attr) and not _is_self(node.value):
        yield node.attr
    elif isinstance(node, ast.Call):
        yield from _call_private_names(node)
    elif isinstance(node, ast.ImportFrom):
        for alias in node.names:
            if is_private(alias.name):
                yield "import " + alias.name


def find_hits(source: str, path: str) -> list[Hit]:
    """Each place in ``source`` (the file ``path``) that uses another module's private name."""
    tree = ast.parse(source, filename=path)
    allowed = owned_names(tree) | {name for file, name in THIRD_PARTY if file == Path(path).as_posix()}
    hits = [
        Hit(path, getattr(node, "lineno", 0), name)
        for node in ast.walk(tree)
        for name in _node_private_names(node)
        if name not in allowed
    ]
    return sorted(hits, key=lambda h: (h.line, h.name))


def python_files(roots: Iterable[Path]) -> Iterator[Path]:
    """Every ``.py`` file under ``roots``, in order, without the generated stubs."""
    for root in roots:
        files = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in files:
            if not any(path.is_relative_to(skip) for skip in GENERATED):
                yield path


def check(roots: Iterable[Path]) -> list[Hit]:
    """The hits in every file under ``roots``."""
    return [hit for path in python_files(roots) for hit in find_hits(path.read_text(), str(path))]


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the hits and their total; 1 when there is any."""
    args = sys.argv[1:] if argv is None else argv
    hits = check(Path(arg) for arg in (args or ROOTS))
    for hit in hits:
        print(hit)
    print(f"{len(hits)} use(s) of another module's private name")
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main())
