"""Microbenchmark: the SCLS DP batcher on 1,000 queued requests (goal: ≤ 50 ms).

Cost model: roofline-fitted SCLS forms of LLaMA2-13B on one A100-80GB (the paper's setting), S = 128.
Prompt lengths uniform in [1, 1024] (the paper's maximum input). Memory: KV of 819,200 B/token,
ζ·(80 GB − weights) as in Eq. 9, i.e. N·(L + S) ≤ budget tokens.

Cases (each timed ``--repeats`` times after one warm-up; p50 / p99 / max in ms):

* ``dp_batches``: the pure DP with the memory bound (runs capped by N_max, O(n·N_max)).
* ``dp_batches_unbounded``: no memory bound (N_max = n: the O(n²) worst case).
* ``dp_batches_scalar``: the memory-bound DP with a t_serve that cannot take arrays (scalar fallback).
* ``form_batch``: ``SclsSliceBatcher.form_batch`` on 1,000 SchedRequests through a PoolView of 16-token
  blocks (candidate filtering, the DP and batch selection; plan cache defeated on every call).

Prints one JSON object to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable

from llmfleet.costmodel.models import model_arch
from llmfleet.policies.batching.scls_dp import SclsOptions, SclsSliceBatcher, default_scls_cost, dp_batches
from llmfleet.policies.request import BatchLimits, PoolView, SchedRequest

GOAL_MS = 50.0
S = 128
ZETA = 0.9


def timed(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    fn()  # warm-up
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[min(len(ms) - 1, math.ceil(0.99 * len(ms)) - 1)], 3),
        "max_ms": round(ms[-1], 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    arch = model_arch("llama2-13b")
    cost = default_scls_cost()
    budget_tokens = int(ZETA * (80e9 - arch.weight_bytes) / arch.kv_bytes_per_token)
    rng = random.Random(args.seed)
    lengths = [rng.randint(1, 1024) for _ in range(args.requests)]

    def t_serve(n: int, ln: int) -> float:
        return cost.t_serve(n, ln, S)

    def t_serve_scalar(n: int, ln: int) -> float:
        return float(cost.t_serve(int(n), int(ln), S))

    def fits(n: int, ln: int) -> bool:
        return n * (ln + S) <= budget_tokens

    tpb = 16
    pool = PoolView(free_blocks=budget_tokens // tpb, watermark_blocks=0, tokens_per_block={"m": tpb})
    limits = BatchLimits(max_requests=10**6, max_prefill_tokens=10**9)
    waiting = [SchedRequest(f"r{i}", "svc", "m", float(i), ln, 1024) for i, ln in enumerate(lengths)]

    def form() -> object:
        # a new batcher each call: a full DP, no plan kept from the call before (ζ already in the pool size)
        batcher = SclsSliceBatcher(SclsOptions(cost=cost, slice_iterations=S, zeta=1.0))
        return batcher.form_batch(waiting, pool, limits, 0.0)

    groups = dp_batches(lengths, t_serve, fits)
    n_max_range = (
        min(budget_tokens // (ln + S) for ln in lengths),
        max(budget_tokens // (ln + S) for ln in lengths),
    )
    cases = {
        "dp_batches": timed(lambda: dp_batches(lengths, t_serve, fits), args.repeats),
        "dp_batches_unbounded": timed(lambda: dp_batches(lengths, t_serve, lambda n, ln: True), args.repeats),
        "dp_batches_scalar": timed(
            lambda: dp_batches(lengths, t_serve_scalar, fits), max(3, args.repeats // 10)
        ),
        "form_batch": timed(form, args.repeats),
    }
    out = {
        "benchmark": "scls_dp_micro",
        "requests": args.requests,
        "slice_iterations": S,
        "cost_model": "roofline llama2-13b / a100-80gb (SCLS forms)",
        "budget_tokens": budget_tokens,
        "n_max_range": list(n_max_range),
        "batches": len(groups),
        "largest_batch": max(len(g) for g in groups),
        "cases": cases,
        "goal_ms": GOAL_MS,
        "meets_goal": cases["dp_batches"]["p99_ms"] <= GOAL_MS and cases["form_batch"]["p99_ms"] <= GOAL_MS,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
