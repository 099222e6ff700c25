"""``python -m tools.bench.sim_fidelity --out .bench`` from the repository root."""

from __future__ import annotations

import sys

from tools.bench.sim_fidelity.cli import main

if __name__ == "__main__":
    sys.exit(main())
