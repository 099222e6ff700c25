"""The SeaLLM scenario's summary of its rows: ratios per rate and the best over the sweep, the goal
against the paper's claim (and where SeaLLM fails requests vLLM completes), and the notes."""

from __future__ import annotations

from typing import Any

from . import common as C

CLAIM = (
    "normalized latency up to 10.38× lower than vLLM (9.52× AlpaServe, 13.60× MuxServe), p99 up to "
    "12.13×/5.80×/18.69× lower, SLO attainment up to 1.82×/3.64×/2.11× higher; SeaLLM's normalized "
    "latency < 3 and SLO attainment > 90% at every rate (2–50 req/s, 32 A800)."
)


def _at(rows: list[dict], rate: float, policy: str) -> dict:
    return next(r for r in rows if r["rate_rps"] == rate and r["policy"] == policy)


def summarize(res: dict) -> None:
    """Adds ``summary``, ``goal``, ``claim``, ``ours`` and ``notes`` to a run's result."""
    per_rate = _per_rate(res["rows"])
    keys = [k for k in per_rate[0] if k.endswith("_over_seallm") or k.startswith("slo_seallm_over")]
    up_to = {k: max((e[k] for e in per_rate if e[k] is not None), default=None) for k in keys}
    res["summary"] = {"per_rate": per_rate, "up_to": up_to}
    res["goal"] = _goal(per_rate, up_to)
    res["claim"] = CLAIM
    res["ours"] = _ours(up_to)
    res["notes"] = _notes(res, per_rate)


def _per_rate(rows: list[dict]) -> list[dict]:
    """Per rate: drains, failures and each baseline's ratios to SeaLLM."""
    rates = sorted({r["rate_rps"] for r in rows})
    per_rate = []
    for rate in rates:
        s = _at(rows, rate, "seallm")
        entry = {
            "rate_rps": rate,
            "seallm_drain_s": s["drain_s"],
            "vllm_drain_s": _at(rows, rate, "vllm")["drain_s"],
            "seallm_failed": s["failed"],
            "vllm_failed": _at(rows, rate, "vllm")["failed"],
            "requests": s["requests"],
        }
        for b in ("vllm", "alpaserve", "muxserve"):
            x = _at(rows, rate, b)
            entry[f"norm_{b}_over_seallm"] = C.ratio(x["norm_latency_mean"], s["norm_latency_mean"])
            entry[f"normp99_{b}_over_seallm"] = C.ratio(x["norm_latency_p99"], s["norm_latency_p99"])
            entry[f"p99_{b}_over_seallm"] = C.ratio(x["latency_p99_s"], s["latency_p99_s"])
            entry[f"slo_seallm_over_{b}"] = C.ratio(s["slo_seallm"], x["slo_seallm"])
        per_rate.append(entry)
    return per_rate


def _goal(per_rate: list[dict], up_to: dict[str, Any]) -> dict[str, Any]:
    best = max(per_rate, key=lambda e: e["norm_vllm_over_seallm"] or 0.0)
    ours = best["norm_vllm_over_seallm"]
    goal = {
        "text": "≥ 10× lower mean normalized latency than vllm-v0.4 somewhere in 2–50 req/s (paper 10.38×; p99 12.13×)",
        "target": 10.0,
        "ours": ours,
        "ours_text": f"{C.fmt(ours)}× at {best['rate_rps']:g} req/s (p99 latency ×{C.fmt(up_to['p99_vllm_over_seallm'])} "
        f"best over the sweep)",
        "met": ours is not None and ours >= 10.0,
    }
    # normalized latency counts completed requests only: say where SeaLLM fails some and vLLM does not
    failing = [e for e in per_rate if e["seallm_failed"] > e["vllm_failed"]]
    same = [e for e in per_rate if e["seallm_failed"] == 0 and e["vllm_failed"] == 0]
    if failing:
        best_same = max(same, key=lambda e: e["norm_vllm_over_seallm"] or 0.0) if same else None
        goal["ours_text"] += (
            "; but SeaLLM fails "
            + ", ".join(f"{e['seallm_failed']}/{e['requests']}" for e in failing)
            + " requests at "
            + ", ".join(f"{e['rate_rps']:g}" for e in failing)
            + " req/s, left out of its figures"
            + (
                f" (on the same requests: {C.fmt(best_same['norm_vllm_over_seallm'])}× at "
                f"{best_same['rate_rps']:g} req/s)"
                if best_same
                else ""
            )
        )
        goal["like_for_like"] = best_same and best_same["norm_vllm_over_seallm"]
    return goal


def _ours(up_to: dict[str, Any]) -> str:
    return (
        f"best ratios over the sweep: mean normalized latency {C.fmt(up_to['norm_vllm_over_seallm'])}× / "
        f"{C.fmt(up_to['norm_alpaserve_over_seallm'])}× / {C.fmt(up_to['norm_muxserve_over_seallm'])}× "
        f"(vLLM/AlpaServe/MuxServe), p99 latency {C.fmt(up_to['p99_vllm_over_seallm'])}× / "
        f"{C.fmt(up_to['p99_alpaserve_over_seallm'])}× / {C.fmt(up_to['p99_muxserve_over_seallm'])}×, SLO "
        f"attainment {C.fmt(up_to['slo_seallm_over_vllm'])}× / {C.fmt(up_to['slo_seallm_over_alpaserve'])}× / "
        f"{C.fmt(up_to['slo_seallm_over_muxserve'])}× (values < 1: SeaLLM is worse)."
    )


def _notes(res: dict, per_rate: list[dict]) -> list[str]:
    """SeaLLM's failures, vLLM's unsettled queue, the run-length study, what differs from the paper and
    the adaptive re-placement."""
    rows = res["rows"]
    failing = [e for e in per_rate if e["seallm_failed"] > e["vllm_failed"]]
    notes = []
    if failing:
        notes.append(
            "SeaLLM's plan fails requests vLLM completes ("
            + ", ".join(
                f"{e['seallm_failed']} of {e['requests']} at {e['rate_rps']:g} req/s" for e in failing
            )
            + "). Normalized latency, p99 and drain count completed requests only, so the ratios at those rates "
            "are not like-for-like; `seallm_failures.py` breaks the failures down by service."
        )
    over = [e["rate_rps"] for e in per_rate if e["vllm_drain_s"] > 0.1 * max(r["horizon_s"] for r in rows)]
    if over:
        notes.append(
            f"vLLM's queue does not settle from {min(over):g} req/s (its last request finishes > 10% of the run "
            "after the arrivals end): there the ratio measures a growing queue, and grows with the run length "
            "(see the run-length table)."
        )
    lens = res.get("run_length") or []
    if lens:
        notes.append(
            "Run length at "
            + f"{lens[0]['rate_rps']:g} req/s: "
            + ", ".join(f"{e['horizon_s']:g} s → ×{C.fmt(e['norm_ratio'])}" for e in lens)
            + " (mean normalized latency, vLLM ÷ SeaLLM)."
        )
    notes.append(
        "Differences that remain: the conv trace stands in for ShareGPT, LongBench-like lengths are synthesized "
        "from SeaLLM's Table 1 means, MAF popularity is a Zipf law unless `--popularity` gives the counts, and "
        "latencies come from the simulator's cost model, not from A800s."
    )
    ad = res.get("adaptive") or []
    if ad:
        parts = []
        for a in ad:
            v = _at(rows, a["rate_rps"], "vllm")
            f = _at(rows, a["rate_rps"], "seallm")
            parts.append(
                f"{a['rate_rps']:g} req/s: adaptive norm {a['norm_latency_mean']:.2f} (×{C.fmt(C.ratio(v['norm_latency_mean'], a['norm_latency_mean']))} "
                f"vs vLLM; {a['replans']} re-placements) vs fixed plan {f['norm_latency_mean']:.2f}"
            )
        notes.append(
            "Adaptive re-placement (`seallm-placement` preset, Eq. 8) beside the fixed plan: "
            + "; ".join(parts)
            + "."
        )
    return notes
