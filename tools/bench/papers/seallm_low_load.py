"""SeaLLM against vLLM's replicas at low load, per service: where Algorithm 1's plan loses, and one
factor that moves it.

    python -m tools.bench.papers.seallm_low_load --assignments 2 3 --rates 2 5 10 \\
        --out .bench/papers-seallm-low

At each (assignment, rate), with the bench's seeds (``seallm.py``: workload 100 + the rate's index,
Algorithm 1 searched on the history 500 + index), three runs of the same workload:

- ``vllm``: the bench's vLLM replicas (the GPUs split evenly among the models);
- ``seallm``: the doubling budget on Algorithm 1's plan, as the bench runs it;
- ``seallm, starved model spread``: the same plan with one change: in every third group of the plan's
  most replicated pair of models, the pair's first model gives its place to the model the plan hosts
  the fewest times (the 70B aside). The engines, dispatch and workload are unchanged.

Each run's mean normalized latency, overall and per service (its requests, model and instances).
Writes ``low_load.json`` and prints one line per run and service.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from llmfleet.policies.placement import InstancePlan

from tools.bench.papers.run import package

package()

from tools.bench.papers import common as C  # noqa: E402
from tools.bench.papers import seallm as SE  # noqa: E402
from tools.bench.papers import seallm_setup as S  # noqa: E402


def spread(plan: list[InstancePlan]) -> tuple[list[InstancePlan], str]:
    """The plan with every third group of its most replicated pair hosting the least hosted model (the
    70B aside) in place of the pair's first model, and what changed."""
    pair = Counter(p.models for p in plan if len(p.models) == 2).most_common(1)[0][0]
    hosts = Counter(m for p in plan for m in p.models)
    starved = min((m for m in hosts if m not in pair and m != "llama2-70b"), key=lambda m: (hosts[m], m))
    out, k = [], 0
    for p in plan:
        if p.models == pair:
            k += 1
            if k % 3 == 0:
                p = InstancePlan(p.instance_id, (pair[1], starved), p.tp)
        out.append(p)
    return (
        out,
        f"{'+'.join(pair)} ×{Counter(p.models for p in plan)[pair]}: every third hosts {starved} instead",
    )


def run(sp: Any, wl: Any, name: str, bundle: Any, plan: list[InstancePlan] | None) -> dict[str, Any]:
    e = C.simulate(sp, wl, bundle, samples=40, plan=plan)
    models = {s.name: s.model for s in sp.services}
    hosts = Counter(m for inst in e.result.instances for m in inst.get("models", ()))
    services = {
        svc: {
            "model": models[svc],
            "requests": m["requests"],
            "norm_latency_mean": m["normalized_latency"]["mean"],
            "tpot_mean_ms": 1000 * m["tpot_s"]["mean"],
            "instances": hosts[models[svc]],
        }
        for svc, m in sorted(e.report["services"].items())
    }
    return {
        "system": name,
        "norm_latency_mean": e.report["overall"]["normalized_latency"]["mean"],
        "services": services,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--assignments", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--rates", type=float, nargs="+", default=[2.0, 5.0, 10.0])
    ap.add_argument("--out", type=Path, default=Path(".bench/papers-seallm-low"))
    a = ap.parse_args(argv)
    cfg = SE.settings(False, False)
    share = S.shares(S.popularity(SE.POPULARITY))
    rows = []
    for assignment in a.assignments:
        sw = SE.make_sweep(cfg, "sharegpt", assignment, share, print)
        for rate in a.rates:
            i = SE.rate_index(rate)
            wl = S.workload(sw.pools, sw.share, rate, cfg["horizon_s"], seed=100 + i)
            plan = sw.plan_at(rate, i)
            variant, change = spread(plan)
            bundle = sw.systems["seallm"][0]
            for name, b, p in (
                ("vllm", sw.systems["vllm"][0], None),
                ("seallm", bundle, plan),
                ("seallm, starved model spread", bundle, variant),
            ):
                r = {
                    "assignment": assignment,
                    "rate_rps": rate,
                    "change": change,
                    **run(sw.sp, wl, name, b, p),
                }
                rows.append(r)
                print(
                    f"a{assignment} {rate:g} req/s {name:30s} norm {r['norm_latency_mean']:.3f}", flush=True
                )
                for svc, m in r["services"].items():
                    print(f"    {svc} {m['model']:11s} {m['requests']:5d} req, instances {m['instances']}, "
                          f"norm {m['norm_latency_mean']:.3f}, TPOT {m['tpot_mean_ms']:.1f} ms", flush=True)  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "low_load.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
