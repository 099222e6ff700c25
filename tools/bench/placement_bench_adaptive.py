"""The adaptive-interval section of ``placement_bench.py``: SeaLLM's re-placement with Eq. 8's adaptive
interval vs fixed intervals, on a workload whose service mix shifts."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from llmfleet.sim.plan_eval import evaluator_factory
from llmfleet.sim.run import preset, simulate
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.workload import Workload, WorkloadRequest, per_service_arrivals

from tools.bench.papers import common as C
from tools.bench.placement_bench_common import COST

CV = 2.0  # burstiness of the adaptive-interval section's Gamma arrivals (SeaLLM headline: S.ARRIVAL_CV)


def adaptive_section(cfg: dict, log) -> dict:
    """Adaptive (Eq. 8) vs fixed replacement interval on a workload whose service mix shifts: 8 ×
    A100-80GB, two services (Llama-2-7B, Llama-2-13B, conv-trace lengths), per-service Gamma (CV 2)
    arrivals whose rates swap every phase; SeaLLM placement (Algorithm 1, simulator in the loop) re-run
    by the simulator's placement loop with a fixed interval or the adaptive one."""

    sp = SimSpec(
        ClusterSpec.parse("8xA100-80GB"), (SimService("a", "llama2-7b"), SimService("b", "llama2-13b"))
    )
    lengths = C.trace_lengths(max_prompt=2048, max_output=2048)
    phase, hi, lo = cfg["adaptive_phase_s"], 6.0, 1.0
    segs = {"a": [(phase, hi), (phase, lo), (phase, hi)], "b": [(phase, lo), (phase, hi), (phase, lo)]}
    times = per_service_arrivals(segs, 3 * phase, cv=CV, seed=5)
    rng = np.random.default_rng(6)
    reqs = []
    for svc, ts in times.items():
        pick = rng.integers(0, len(lengths), len(ts))
        reqs += [WorkloadRequest(f"{svc}-{i}", float(t), int(lengths[j][0]), int(lengths[j][1]), svc)
                 for i, (t, j) in enumerate(zip(ts.tolist(), pick.tolist(), strict=True))]  # fmt: skip
    wl = Workload(tuple(reqs))

    rows = []
    variants = {f"fixed {x:g} s": (x, False) for x in cfg["adaptive_fixed"]} | {
        f"adaptive from {cfg['adaptive_start']:g} s": (cfg["adaptive_start"], True)
    }
    for name, (interval, adaptive) in variants.items():
        placement = {"policy": "seallm", "interval_s": interval, "adaptive_interval": adaptive}
        b = dataclasses.replace(preset("seallm", placement=placement), name=name)
        t0 = time.perf_counter()
        e = simulate(sp, wl, b, samples=20, evaluator_factory=evaluator_factory(preset("seallm")))
        m = C.metrics(e)
        decisions = e.report.get("placement", [])
        applied = [d for d in decisions if d.get("status") == "applied"]
        rows.append({"variant": name, **{k: m[k] for k in ("norm_latency_mean", "latency_p99_s", "slo_seallm")},
                     "replans": len(decisions), "applied": len(applied),
                     "moves": sum(d.get("moves", 0) for d in applied), "wall_s": time.perf_counter() - t0})  # fmt: skip
        log(f"  adaptive {name:22s} norm {m['norm_latency_mean']:.2f} slo {m['slo_seallm']:.3f} "
            f"replans {len(decisions)} applied {len(applied)}")  # fmt: skip
    md = C.md_table(rows, [("interval", "variant", ""), ("norm. latency", "norm_latency_mean", ".2f"),
                           ("p99 (s)", "latency_p99_s", ".1f"), ("SLO att.", "slo_seallm", ".3f"),
                           ("re-plans", "replans", ""), ("applied", "applied", ""), ("model moves", "moves", "")])  # fmt: skip
    return {
        "setup": {"cluster": "8xA100-80GB", "phases": segs, "cv": CV, "cost": COST},
        "rows": rows,
        "markdown": md,
    }
