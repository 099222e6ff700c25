"""SeaLLM, one factor at a time at one rate: what moves the vLLM ÷ SeaLLM normalized-latency ratio.

    python tools/bench/papers/seallm_factors.py --rate 20 --horizon 300 --out .bench/papers-seallm-factors

Each row changes one thing against the bench's setup (``seallm_setup``), with the same seeds as the
bench's sweep at that rate (``seallm.py``: workload seed 100 + the rate's index, history 500 + index):

- ``bench``: the setup as ``bench-papers`` runs it (Zipf shares dealt round-robin);
- ``equal-shares``: every service a quarter of the rate (the pre-issue-24 setup's shares);
- ``seallm-fcfs``: Algorithm 1's plan and dispatch, with vLLM's engines (FCFS, one phase per iteration)
  instead of the doubling budget — the scheduler's part of the ratio;
- ``sharegpt-lengths``: the conv trace's lengths in the k-means replaced by as many ShareGPT-like pairs
  (vLLM paper means 161 in / 338 out, ``workload.paperlike``): the paper's ShareGPT, whose prompts are
  ~7× shorter than the conv trace's;
- ``run-length``: see ``seallm.py``'s run-length study (not repeated here).

Also the prefill work each rate offers, in GPUs busy with prefill alone (Σ rate × share × mean
``roofline.prefill_time`` × TP at the services' smallest TP: 1, 70B 2), for both length pools: a lower
bound on the GPUs any system needs, against the cluster's 32.

Writes ``factors.json`` and prints one line per row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from llmfleet.costmodel import hardware, model_arch, prefill_time
from llmfleet.workload import Workload, WorkloadRequest, sharegpt_like_lengths

from . import common as C
from . import seallm_setup as S


def row(sp, wl, bundle, plan, horizon: float) -> dict:
    e = C.simulate(sp, wl, bundle, samples=40, plan=plan)
    m = C.metrics(e)
    return {
        "norm_mean": m["norm_latency_mean"],
        "norm_p99": m["norm_latency_p99"],
        "latency_p99_s": m["latency_p99_s"],
        "drain_s": max(0.0, m["makespan_s"] - horizon),
        "failed": m["failed"],  # normalized latency counts completed requests only
    }


def prefill_gpus(pools: dict, share: dict, rate: float, samples: int = 400) -> float:
    """GPUs kept busy by prefill alone at ``rate`` (see the module docstring)."""

    hw = hardware("a100-80gb")
    total = 0.0
    for s, (model, lens) in pools.items():
        tp = 2 if model == "llama2-70b" else 1
        arch = model_arch(model)
        sub = lens[:: max(1, len(lens) // samples)]
        per_req = float(sum(prefill_time(arch, hw, int(p), tp) for p in sub[:, 0]) / len(sub)) * tp
        total += rate * share[s] * per_req
    return total


def sharegpt_conv(n: int):
    a = sharegpt_like_lengths(n, seed=11, max_prompt=4096, max_output=4096)
    return Workload(
        tuple(WorkloadRequest(f"g{i}", 0.0, int(p), int(o), "") for i, (p, o) in enumerate(a.tolist()))
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--horizon", type=float, default=S.HORIZON_S)
    ap.add_argument("--out", type=Path, default=Path(".bench/papers-seallm-factors"))
    a = ap.parse_args(argv)
    idx = S.RATES.index(a.rate) if a.rate in S.RATES else 0
    sp = S.spec()
    pools = S.length_pools(C.conv_trace(), sp)
    zipf = S.shares(S.popularity())
    equal = {s: 1.0 / len(S.SERVICES) for s in S.SERVICES}
    vllm = S.vllm()
    fixed = S.seallm_fixed()
    fcfs = dataclasses.replace(fixed.with_overrides(engine=vllm.engine), name="seallm-fcfs")
    conv = C.conv_trace()
    short = S.length_pools(sharegpt_conv(len(conv)), sp)
    demand = [
        {
            "rate_rps": r,
            "prefill_gpus_conv": prefill_gpus(pools, zipf, r),
            "prefill_gpus_sharegpt": prefill_gpus(short, zipf, r),
        }
        for r in S.RATES
    ]
    for d in demand:
        print(f"prefill demand at {d['rate_rps']:g} req/s: {d['prefill_gpus_conv']:.1f} GPUs (conv∪LongBench-like), "
              f"{d['prefill_gpus_sharegpt']:.1f} (ShareGPT-like∪LongBench-like) of 32", flush=True)  # fmt: skip
    out = []
    factors = (
        ("bench", zipf, fixed, pools), ("equal-shares", equal, fixed, pools), ("seallm-fcfs", zipf, fcfs, pools),
        ("sharegpt-lengths", zipf, fixed, short),
    )  # fmt: skip
    for label, share, sea, pl in factors:
        t0 = time.perf_counter()
        wl = S.workload(pl, share, a.rate, a.horizon, seed=100 + idx)
        hist = S.workload(pl, share, a.rate, S.HISTORY_S, seed=500 + idx)
        plan, why = S.place(sp, hist)
        v, s = row(sp, wl, vllm, None, a.horizon), row(sp, wl, sea, plan, a.horizon)
        r = {
            "factor": label, "rate_rps": a.rate, "horizon_s": a.horizon, "requests": len(wl),
            "shares": {k: round(x, 4) for k, x in share.items()}, "plan": why,
            "vllm": v, "seallm": s,
            "norm_ratio": C.ratio(v["norm_mean"], s["norm_mean"]),
            "norm_p99_ratio": C.ratio(v["norm_p99"], s["norm_p99"]),
        }  # fmt: skip
        out.append(r)
        print(f"{label:13s} {a.rate:g} req/s: vLLM norm {v['norm_mean']:.2f} (drain {v['drain_s']:.0f}s), "
              f"SeaLLM {s['norm_mean']:.2f} (drain {s['drain_s']:.0f}s) → ×{C.fmt(r['norm_ratio'])} mean, "
              f"×{C.fmt(r['norm_p99_ratio'])} p99; failed vLLM {v['failed']}, SeaLLM {s['failed']} of "
              f"{len(wl)} [{time.perf_counter() - t0:.0f}s]", flush=True)  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "factors.json").write_text(
        json.dumps({"factors": out, "prefill_demand": demand}, indent=1, default=float)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
