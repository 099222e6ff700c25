"""``python tools/bench/sim_fidelity --out .bench`` (or ``python -m sim_fidelity`` from ``tools/bench``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGE = "llmfleet_sim_fidelity"  # the private name the package gets when run as a directory


def _main():
    if __package__:  # python -m sim_fidelity
        from .cli import main

        return main
    # python tools/bench/sim_fidelity: no parent package, so import this directory as one (relative
    # imports then work), and keep its modules (cluster, report, ...) from shadowing top-level names
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    spec = importlib.util.spec_from_file_location(
        PACKAGE, here / "__init__.py", submodule_search_locations=[str(here)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(package)
    return package.main


if __name__ == "__main__":
    sys.exit(_main()())
