"""``papers/common.py`` (workloads, metrics, markdown tables of the paper benchmarks) as one module
for every bench script run from ``tools/bench`` (it is not a package: loaded by path, once)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

NAME = "llmfleet_bench_common"


def load_seallm_setup() -> ModuleType:
    """``papers/seallm_setup.py``: the one SeaLLM setup, shared by ``papers/seallm.py`` and
    ``placement_bench.py`` (loaded by path, once)."""
    name = NAME + "_seallm_setup"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parent / "papers" / "seallm_setup.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


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
