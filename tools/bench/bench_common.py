"""``papers/common.py`` (workloads, metrics, markdown tables of the paper benchmarks) as one module
for every bench script run from ``tools/bench`` (it is not a package: loaded by path, once)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

NAME = "llmfleet_bench_common"


def load() -> ModuleType:
    if NAME in sys.modules:
        return sys.modules[NAME]
    spec = importlib.util.spec_from_file_location(
        NAME, Path(__file__).resolve().parent / "papers" / "common.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = mod
    spec.loader.exec_module(mod)
    return mod
