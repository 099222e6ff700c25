"""The Aladdin scenario (``aladdin.py``) with chosen models and top rates, optionally without the
one-seed sweep over the lower rates: the P100 headline alone, for a machine that cannot give the full
run its time.

    python tools/bench/papers/aladdin_headline.py --rate llama2-7b=50 --rate llama2-70b=40 \\
        --no-sweep --out .bench/papers-aladdin-headline

``--split-only`` runs the split-phase decode arm alone (``aladdin_split.py``), ``--no-split`` skips it.
Everything else is the full run's setup (seeds, durations, configs). Writes ``aladdin.json`` and
``aladdin.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.bench.papers.run import common, package, scenario

package()
ALADDIN = scenario("aladdin")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", action="append", default=[], metavar="MODEL=RATE",
                    help="a model and its top rate (repeatable; default: every model at its top rate)")  # fmt: skip
    ap.add_argument("--no-sweep", action="store_true", help="skip the one-seed sweep over the lower rates")
    ap.add_argument(
        "--config", action="append", default=[], help="a headline config (repeatable; default all)"
    )
    ap.add_argument(
        "--duration", type=float, default=None, help="seconds of arrivals per rate (default the full run's)"
    )
    ap.add_argument("--no-paper-size", action="store_true", help="skip the headline at Table 3's worker size")
    ap.add_argument("--no-split", action="store_true", help="skip the split-phase decode arm (Fig. 12)")
    ap.add_argument(
        "--split-only", action="store_true", help="only the split-phase decode arm (no sweep, no headline)"
    )
    ap.add_argument("--cost-source", default=None, help="the simulator's cost source (default: its own)")
    ap.add_argument("--out", type=Path, default=Path(".bench/papers-aladdin-headline"))
    a = ap.parse_args(argv)
    if a.cost_source is not None:
        common().set_cost_source(a.cost_source)
    full = ALADDIN.settings(quick=False, tiny=False)
    models = dict(full["models"])
    if a.rate:
        chosen = {}
        for item in a.rate:
            name, _, rate = item.partition("=")
            mc = models[name]
            top = float(rate) if rate else mc["rates"][-1]
            chosen[name] = {**mc, "rates": (*(r for r in mc["rates"] if r < top), top)}
        models = chosen
    cfg = {**full, "models": models, "sweep": not a.no_sweep, "paper_size": not a.no_paper_size}
    cfg.update(split=not a.no_split)
    if a.split_only:
        cfg.update(sweep=False, default_arm=False, split=True)
    if a.duration is not None:
        cfg.update(duration_s=a.duration, min_requests=0)
    if a.config:
        cfg["headline"] = a.config
    res = ALADDIN.run(cfg=cfg, log=lambda m: print(m, flush=True))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "aladdin.json").write_text(json.dumps(res, indent=1, default=float))
    (a.out / "aladdin.md").write_text(ALADDIN.markdown(res))
    print(res["goal"]["ours_text"], flush=True)
    if res["split_text"]:
        print(res["split_text"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
