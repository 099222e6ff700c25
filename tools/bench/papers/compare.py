"""Whether two runs of the paper benchmark give the same numbers: every field of two ``papers.json``
compared, wall and CPU times and the run's metadata left out (the simulations are seeded, so a change
that only makes the benchmark faster must leave every other field as it was).

    python -m tools.bench.papers.compare .bench/papers-before/papers.json .bench/papers-after/papers.json
    python -m tools.bench.papers.compare OLD NEW --only seallm --only mell

Prints per paper "identical" or its differences (path: old vs new); exits 1 when any paper differs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

# fields that measure the run, not the simulation: wall and CPU seconds, the unit count and times
TIMES = frozenset({"wall_s", "cpu_s", "unit_s", "unit_times", "units", "sim_wall_s"})


def differences(old: Any, new: Any, path: str = "") -> list[str]:
    """Every difference between ``old`` and ``new`` (JSON values) outside :data:`TIMES`, as
    ``path: old vs new`` (NaN equals NaN)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            if k in TIMES:
                continue
            if k not in old or k not in new:
                out.append(f"{path}/{k}: only in the {'new' if k not in old else 'old'} run")
            else:
                out += differences(old[k], new[k], f"{path}/{k}")
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: {len(old)} vs {len(new)} entries"]
        return [
            d
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    both_nan = isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new)
    return [] if old == new or both_nan else [f"{path}: {old!r} vs {new!r}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--only", action="append", help="a paper to compare (repeatable; default: every paper)")
    a = ap.parse_args(argv)
    old, new = (json.loads(p.read_text())["papers"] for p in (a.old, a.new))
    same = True
    for paper in a.only or sorted(set(old) | set(new)):
        diffs = differences(old.get(paper), new.get(paper), paper)
        same = same and not diffs
        print(f"{paper}: " + ("identical" if not diffs else f"{len(diffs)} difference(s)"))
        for d in diffs[:20]:
            print(f"    {d}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
