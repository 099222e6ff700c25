"""Which requests SeaLLM's fixed plan fails in a ``make bench-papers`` run, per service, with the reason.

    python -m tools.bench.papers.seallm_failures --papers .bench/papers/papers.json --sweep sharegpt/a2 --rate 2

Re-simulates each sweep's workload at each rate (same pools and seeds as ``papers/seallm.py``) on the
plan that run recorded for it (``papers.json`` → ``seallm.plans``, keyed ``lengths/aN@rate``), and
prints failed / total per service and the most common failure reasons. Normalized latency counts completed requests only, so a failed request drops
out of SeaLLM's figures; this says which ones. ``--by-service`` also prints, per service, the mean
normalized latency of the completed requests and the last finish, on that plan and under ``vllm-v0.4``.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from llmfleet.policies.placement import InstancePlan

from tools.bench.papers import common as C
from tools.bench.papers import seallm_setup as S
from tools.bench.papers.seallm import make_sweep, rate_index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--papers", type=Path, default=Path(".bench/papers/papers.json"))
    ap.add_argument(
        "--rate", type=float, action="append", help="req/s (repeatable; default: every planned rate)"
    )
    ap.add_argument(
        "--sweep", action="append", help="lengths/aN, e.g. sharegpt/a2 (repeatable; default: all)"
    )
    ap.add_argument("--by-service", action="store_true", help="per-service latency, SeaLLM's plan and vLLM")
    a = ap.parse_args(argv)

    res = json.loads(a.papers.read_text())["papers"]["seallm"]
    share = S.shares(S.popularity())
    for key in res["plans"]:
        tag, rate_text = key.rsplit("@", 1)
        rate = float(rate_text)
        if (a.rate and rate not in a.rate) or (a.sweep and tag not in a.sweep):
            continue
        lengths, assignment = tag.split("/a")
        sw = make_sweep({}, lengths, int(assignment), share, lambda _msg: None)
        sp, model = sw.sp, {s.name: s.model for s in sw.sp.services}
        wl = S.workload(sw.pools, share, rate, S.HORIZON_S, seed=100 + rate_index(rate))
        plan = []
        for line in res["plans"][key]["plan"]:
            iid, rest = line.split(": ")
            tp, models = rest.split(" ", 1)
            plan.append(InstancePlan(iid, tuple(models.split("+")), int(tp.removeprefix("tp"))))
        e = C.simulate(sp, wl, S.seallm_fixed(), samples=40, plan=plan)
        failed: collections.Counter[str] = collections.Counter()
        total: collections.Counter[str] = collections.Counter()
        why: collections.Counter[str] = collections.Counter()
        for rec in e.result.records:
            total[rec.service] += 1
            if rec.failed:
                failed[rec.service] += 1
                reason = rec.failed.split(";")[0]
                why["prompt too long for the KV pool" if "KV blocks" in reason else reason[:80]] += 1
        print(
            f"{tag} {rate:g} req/s: {sum(failed.values())} of {len(wl)} failed; "
            + ", ".join(f"{s} ({model[s]}) {failed[s]}/{total[s]}" for s in sorted(total))
        )
        for reason, n in why.most_common(3):
            print(f"    {n} × {reason}")
        if a.by_service:
            for name, records in (
                ("seallm", e.result.records),
                ("vllm", C.simulate(sp, wl, S.vllm(), samples=40).result.records),
            ):
                print(f"    {name}: " + "; ".join(_by_service(records, model)))
    return 0


def _by_service(records, model: dict[str, str]) -> list[str]:
    """Per service: completed requests' mean normalized latency (latency ÷ the service's mean solo time,
    as ``sim.metrics``) and the last finish (s)."""
    out = []
    for s in sorted({r.service for r in records}):
        solos = [r.solo_s for r in records if r.service == s and r.solo_s > 0]
        done = [r for r in records if r.service == s and r.done]
        if not solos or not done:
            out.append(f"{model[s]} none completed")
            continue
        norm = sum(r.latency_s for r in done) / len(done) / (sum(solos) / len(solos))
        out.append(f"{model[s]} norm {norm:.1f}, last finish {max(r.finish_s for r in done):.0f} s")
    return out


if __name__ == "__main__":
    sys.exit(main())
