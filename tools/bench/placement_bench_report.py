"""The report of ``placement_bench.py``: ``placement.md`` and the PNGs (SeaLLM sweep, Aladdin's GPUs)."""

from __future__ import annotations

from pathlib import Path

from tools.bench.papers import common as C
from tools.bench.placement_bench_common import COST


def markdown(res: dict) -> str:
    lines = ["# Fleet placement benchmark", "", f"Cost source: {COST}.", ""]
    s = res["seallm"]
    lines += ["## SeaLLM headline (32 × A100-80GB, 4 services, per-service bursty arrivals)", ""]
    lines += [C.md_table(s["rows"], [("req/s", "rate_rps", ".0f"), ("policy", "policy", ""),
                                     ("norm. latency", "norm_latency_mean", ".2f"), ("p99 (s)", "latency_p99_s", ".1f"),
                                     ("SLO att.", "slo_seallm", ".3f"), ("GPUs", "gpus", "")]), ""]  # fmt: skip
    g = s["goal"]
    lines += [
        f"- Goal: {g['text']} → **{C.fmt(g['ours'])}×** at {g['at_rate_rps']:g} req/s ({'met' if g['met'] else 'not met'}).",
    ]
    mixed = s["ratios"][-1].get("norm_vllm_mixed_over_seallm")
    lines += [f"- vLLM with mixed prefill + decode iterations (`vllm-mixed`) over SeaLLM at {g['at_rate_rps']:g} req/s: "
              f"{C.fmt(mixed)}×.", ""]  # fmt: skip
    for x in s["searches"]:
        lines += [f"- placement at {x['rate_rps']:g} req/s: {'; '.join(x['plan'])} — {x['reason']}"]
    a = res["aladdin"]
    lines += [
        "",
        f"## Aladdin: GPUs for 100 % / 99 % SLO attainment ({a['setup']['model']}, N* = {a['setup']['n_star']})",
        "",
    ]
    lines += [C.md_table(a["rows"], [("req/s", "rate_rps", ".0f"), ("target", "target", ".2f"), ("policy", "policy", ""),
                                     ("workers", "workers", ""), ("GPUs", "gpus", ""), ("att.", "attainment", ".3f")]), ""]  # fmt: skip
    lines += [
        f"- Goal: {a['goal']['text']} → best {C.fmt(a['goal']['ours_best'])}× at the roofline N*, "
        f"{C.fmt(a['goal']['ours_best_paper_n'])}× at the paper's N* ({'met' if a['goal']['met'] else 'not met'})."
    ]
    if a["fit"]:
        lines += [f"- Eq. 7 fit on Aladdin's 99 % points: k5 = {a['fit']['k5']:.3f}, c5 = {a['fit']['c5']:.2f}; planner: "
                  + ", ".join(f"{p['rate_rps']:g} req/s → {p['gpus']} GPUs" for p in a["fit"]["planner"])]  # fmt: skip
    t = res["search"]
    lines += ["", "## Placement search time", "", f"- {t['text']}: worst {t['worst_s']:.1f} s ({t['simulations']} simulations) "
              f"({'met' if t['met'] else 'not met'}); all: {', '.join(f'{x:.1f}' for x in t['all_s'])} s."]  # fmt: skip
    if res.get("speculation"):
        sp = res["speculation"]
        on, off = sp["speculate"], sp["plain"]
        lines += [f"- Speculation side by side at {sp['rate_rps']:g} req/s ({sp['processes']} processes, runs alternating): "
                  f"with {on['min']:.1f} / {on['median']:.1f} / {on['max']:.1f} s (min / median / max; {on['simulations']} "
                  f"simulations, {on['hits']} of {on['speculated']} speculative ones used), without {off['min']:.1f} / "
                  f"{off['median']:.1f} / {off['max']:.1f} s ({off['simulations']} simulations); same plan: {sp['same_plan']}."]  # fmt: skip
    if res.get("adaptive"):
        ad = res["adaptive"]
        lines += ["", "## Adaptive vs fixed replacement interval", "", ad.get("markdown", "")]
    return "\n".join(lines) + "\n"


def plot(res: dict, out: Path) -> list[Path]:
    paths = [
        C.plot_sweep(
            res["seallm"]["rows"],
            [
                ("norm_latency_mean", "normalized latency", True),
                ("latency_p99_s", "p99 latency (s)", True),
                ("slo_seallm", "SLO attainment", False),
            ],
            out / "placement_seallm.png",
            "SeaLLM placement vs baselines (32 × A100-80GB)",
        ),
    ]
    for t in (1.0, 0.99):
        rows = [r for r in res["aladdin"]["rows"] if r["target"] == t and r["gpus"]]
        if rows:
            paths.append(C.plot_sweep(rows, [("gpus", "GPUs", False)], out / f"placement_aladdin_{int(t * 100)}.png",
                                      f"GPUs for {t:.0%} SLO attainment"))  # fmt: skip
    return paths
