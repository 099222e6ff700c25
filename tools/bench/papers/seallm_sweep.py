"""The SeaLLM scenario (``seallm.py``) with its sweep's settings chosen on the command line: a subset of
the full run's rates and assignments, for a machine that cannot give the full sweep its hours.

    python tools/bench/papers/seallm_sweep.py --rates 5 10 20 30 40 --assignments 0 1 2 3 \\
        --conv-rates 20 --out .bench/papers-seallm-sweep

Everything else is the full run's setup (300 s of arrivals, 60 s of history for Algorithm 1, the same
seeds per rate). Writes ``seallm.json`` and ``seallm.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.bench.papers.run import common, package, scenario

package()
SEALLM = scenario("seallm")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    full = SEALLM.settings(quick=False, tiny=False)
    ap.add_argument("--rates", type=float, nargs="+", default=list(full["rates"]))
    ap.add_argument("--assignments", type=int, nargs="+", default=list(full["assignments"]))
    ap.add_argument("--conv-rates", type=float, nargs="*", default=list(full["conv_rates"]))
    ap.add_argument("--adaptive-rates", type=float, nargs="*", default=[])
    ap.add_argument("--run-lengths", type=float, nargs="*", default=[])
    ap.add_argument("--horizon", type=float, default=full["horizon_s"])
    ap.add_argument("--cost-source", default=None, help="the simulator's cost source (default: its own)")
    ap.add_argument("--out", type=Path, default=Path(".bench/papers-seallm-sweep"))
    a = ap.parse_args(argv)
    if a.cost_source is not None:
        common().set_cost_source(a.cost_source)
    cfg = {
        **full,
        "rates": tuple(a.rates),
        "assignments": tuple(a.assignments),
        "conv_rates": tuple(a.conv_rates),
        "adaptive_rates": tuple(a.adaptive_rates),
        "lengths": tuple(a.run_lengths),
        "horizon_s": a.horizon,
    }
    res = SEALLM.run(cfg=cfg, log=lambda m: print(m, flush=True))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "seallm.json").write_text(json.dumps(res, indent=1, default=float))
    (a.out / "seallm.md").write_text(SEALLM.markdown(res))
    print(res["goal"]["ours_text"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
