"""Fleet placement benchmark (``make bench-placement``): JSON + markdown + PNG under --out.

Sections (setups mirror the papers; nothing here is tuned to reach a goal):

1. **SeaLLM headline** — the one SeaLLM setup of ``papers/seallm_setup.py`` (shared with
   ``papers/seallm.py``; paper §6.1 quoted there): 32 × A100-80GB; OPT-6.7B, Llama-2-7B/13B/70B on
   k-means clusters of conv-trace ∪ LongBench-like lengths; per-service rates from function popularity
   dealt round-robin (Zipf law matched to MAF's published tail), each service its own Gamma process
   (CV 4); 2–50 req/s, 300 s runs. Policies: ``vllm`` (``vllm-v0.4``: the paper's baseline),
   ``vllm-mixed`` (mixed prefill + decode iterations, for reference), ``alpaserve``
   (``alpaserve-v0.4``), ``muxserve``, ``seallm-colocated`` (colocated, DB), ``seallm-adaptive`` (the
   ``seallm-placement`` preset: Algorithm 1 + Eq. 8 during the run, as ``papers/seallm.py``) and
   ``seallm`` (Algorithm 1's placement searched once on a separate 60 s history of the same processes,
   fixed: the paper's SeaLLM-A ablation), with caps (1, 2) and FCFS-engine variants. Metrics:
   normalized latency, p99, SLO attainment (5 × solo time), over a rate sweep.
2. **Aladdin** — GPUs for 100 % and 99 % SLO attainment (TTFT ≤ 600 ms, ATGT ≤ 30 ms, Llama-2-13B,
   Table 2) vs Poisson arrival rate for ``aladdin`` (best-fit dispatch on N_g* workers), ``jsq-opt``
   (JSQ on N_g* workers) and ``vllm-default`` (JSQ over 4-GPU workers); engines FCFS with one phase per
   iteration (Aladdin runs on vLLM 0.2–0.4, as in ``papers/aladdin.py``); then Eq. 7 fitted on
   Aladdin's 99 % points and the :class:`AladdinPlanner` provisioning with that fit (in-sample).
3. **Placement search time** — SeaLLM's search for 32 GPUs and 4 services, candidates simulated in
   2 processes (this machine has 2 cores; the paper used 8); ``--only search`` times it at the top
   rate with and without speculation, runs alternating (same plan either way).
4. **Adaptive vs fixed replacement interval** — see ``adaptive_section`` (needs the simulator's
   placement loop).

Cost source: the simulator's roofline cost models for the catalog A100-80GB (no GPU-fitted profiles).
"""

from __future__ import annotations

# The parts: placement_bench_seallm (SeaLLM headline, search time), placement_bench_aladdin,
# placement_bench_adaptive, placement_bench_report (markdown, PNGs); placement_bench_common holds what
# they share.
import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tools.bench.papers import common as C
from tools.bench.placement_bench_adaptive import CV, adaptive_section
from tools.bench.placement_bench_aladdin import ALADDIN_MODEL, ALADDIN_SLO, ENGINE, THETA, aladdin_section
from tools.bench.placement_bench_common import COST, MODELS4, S
from tools.bench.placement_bench_report import markdown, plot
from tools.bench.placement_bench_seallm import (
    HISTORY_S,
    bursty_workload,
    clusters,
    seallm_place,
    seallm_section,
    seallm_spec,
    search_section,
    speculation_section,
)

__all__ = [
    "ALADDIN_MODEL",
    "ALADDIN_SLO",
    "COST",
    "CV",
    "ENGINE",
    "HISTORY_S",
    "MODELS4",
    "THETA",
    "C",
    "S",
    "adaptive_section",
    "aladdin_section",
    "bursty_workload",
    "clusters",
    "main",
    "markdown",
    "plot",
    "seallm_place",
    "seallm_section",
    "seallm_spec",
    "search_section",
    "settings",
    "speculation_section",
]


def settings(quick: bool) -> dict:
    if quick:
        return {
            "rates": (10.0, 40.0),
            "horizon_s": 60.0,
            "aladdin_rates": (5.0, 15.0),
            "aladdin_s": 30.0,
            "processes": 2,
            "search_reps": 1,
            "adaptive_phase_s": 60.0,
            "adaptive_fixed": (15.0, 60.0),
            "adaptive_start": 30.0,
        }
    return {"rates": S.RATES, "horizon_s": S.HORIZON_S,
            "aladdin_rates": (5.0, 10.0, 20.0, 30.0), "aladdin_s": 60.0, "processes": 2, "search_reps": 3,
            "adaptive_phase_s": 120.0, "adaptive_fixed": (30.0, 120.0), "adaptive_start": 60.0}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(".bench/placement"))
    ap.add_argument("--quick", action="store_true", help="two rates, shorter horizons")
    ap.add_argument("--only", action="append", choices=("seallm", "search", "aladdin", "adaptive"))
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    cfg = settings(args.quick)
    only = set(args.only or ("seallm", "search", "aladdin", "adaptive"))
    t0 = time.perf_counter()
    res: dict[str, Any] = {"settings": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}}
    if "seallm" in only:
        res["seallm"] = seallm_section(cfg, print)
        res["search"] = search_section(res["seallm"])
    if "search" in only:
        res["speculation"] = speculation_section(cfg, print)
    if "aladdin" in only:
        res["aladdin"] = aladdin_section(cfg, print)
    if "adaptive" in only:
        res["adaptive"] = adaptive_section(cfg, print)
    res["wall_s"] = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "placement.json"
    if path.exists() and args.only:  # a partial run updates the sections it ran
        res = {**json.loads(path.read_text()), **res}
    path.write_text(json.dumps(res, indent=1, default=str))
    if {"seallm", "aladdin"} <= set(res):
        (args.out / "placement.md").write_text(markdown(res))
        if not args.no_plots:
            plot(res, args.out)
    print(f"wrote {args.out}/placement.json ({res['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
