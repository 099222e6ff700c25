"""Every module under tools/ imports, so a broken import in a benchmark or tool fails CI, not its next run."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def tool_modules() -> list[str]:
    """Dotted names of every module under tools/ (packages by their name, without ``__init__``)."""
    names = []
    for path in sorted((ROOT / "tools").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts).removesuffix(".__init__"))
    return names


def test_the_tools_are_found():
    names = tool_modules()
    assert "tools.bench.sim_bench" in names and "tools.chaos.chaos" in names and "tools" in names


@pytest.mark.parametrize("name", tool_modules())
def test_tool_module_imports(name):
    importlib.import_module(name)
