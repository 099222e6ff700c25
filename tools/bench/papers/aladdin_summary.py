"""The Aladdin scenario's summary of its rows: GPU ratios per rate and at each model's top rate (P99 and
P100), the goal against the paper's claim, and the notes that explain the numbers."""

from __future__ import annotations

from typing import Any

from llmfleet.costmodel import hardware, model_arch

from . import common as C
from .aladdin_setup import CLAIM, GOAL_CONFIGS, HW, THETA


def _gpus(rows, model, rate, config, key="gpus"):
    r = next(
        (x for x in rows if x["model"] == model and x["rate_rps"] == rate and x["config"] == config), None
    )
    return None if r is None else r.get(key)


def summarize(res: dict) -> None:
    """Adds ``summary``, ``claim``, ``goal``, ``ours`` and ``notes`` to a run's result."""
    s = _summary(res["rows"], res["workers"])
    s["headline"] = _headline(res.get("headline") or [])
    res["summary"] = s
    res["claim"] = CLAIM
    res["goal"] = _goal(s)
    res["ours"] = _ours(s)
    res["notes"] = _notes(res["rows"], res["workers"])


def _per_rate(rows: list[dict]) -> list[dict]:
    """Per model and rate: Aladdin's, JSQ-optimal's and default vLLM's GPUs and their ratios."""
    per = []
    for model in dict.fromkeys(r["model"] for r in rows):
        rates = sorted({r["rate_rps"] for r in rows if r["model"] == model})
        for rate in rates:
            a, j, v = (_gpus(rows, model, rate, c) for c in ("aladdin", "jsq-opt", "vllm-default"))
            au = _gpus(rows, model, rate, "aladdin", "gpus_used")
            per.append(
                {
                    "model": model,
                    "rate_rps": rate,
                    "aladdin": a,
                    "aladdin_used": au,
                    "jsq_opt": j,
                    "vllm_default": v,
                    "aladdin_over_jsq": C.ratio(a, j),
                    "aladdin_used_over_jsq": C.ratio(au, j),
                    "aladdin_over_vllm": C.ratio(a, v),
                    "top": rate == rates[-1],
                }
            )
    return per


def _summary(rows: list[dict], workers: dict[str, Any]) -> dict[str, Any]:
    """The per-rate ratios and the totals at each model's top rate (P99, P100, the paper's N*)."""
    per = _per_rate(rows)
    top = [p for p in per if p["top"]]
    tot_a = sum(p["aladdin"] for p in top if p["aladdin"] is not None and p["jsq_opt"] is not None)
    tot_j = sum(p["jsq_opt"] for p in top if p["aladdin"] is not None and p["jsq_opt"] is not None)
    tot_au = sum(p["aladdin_used"] for p in top if p["aladdin_used"] is not None and p["jsq_opt"] is not None)
    tot_v = sum(p["vllm_default"] for p in top if p["aladdin"] is not None and p["vllm_default"] is not None)
    ours = C.ratio(tot_a, tot_j)
    p100 = [
        (_gpus(rows, p["model"], p["rate_rps"], "aladdin", "gpus_p100"),
         _gpus(rows, p["model"], p["rate_rps"], "jsq-opt", "gpus_p100"))
        for p in top
    ]  # fmt: skip
    tot_a100 = sum(a for a, j in p100 if a and j)
    tot_j100 = sum(j for a, j in p100 if a and j)
    ours100 = C.ratio(tot_a100, tot_j100)
    best = min((p["aladdin_over_jsq"] for p in per if p["aladdin_over_jsq"] is not None), default=None)
    paper_cfg = [
        (
            p,
            _gpus(rows, p["model"], p["rate_rps"], f"aladdin@{workers[p['model']]['paper_n']}gpu"),
            _gpus(rows, p["model"], p["rate_rps"], f"jsq@{workers[p['model']]['paper_n']}gpu"),
        )
        for p in top
    ]
    paper_ratio = C.ratio(
        sum(a for _, a, j in paper_cfg if a and j), sum(j for _, a, j in paper_cfg if a and j)
    )
    summary = {
        "per_rate": per,
        "top_rate_gpus": {"aladdin": tot_a, "aladdin_used": tot_au, "jsq_opt": tot_j, "vllm_default": tot_v},
        "aladdin_over_jsq_top": ours,
        "aladdin_used_over_jsq_top": C.ratio(tot_au, tot_j),
        "aladdin_over_vllm_top": C.ratio(tot_a, tot_v),
        "best_aladdin_over_jsq": best,
        "paper_n_aladdin_over_jsq_top": paper_ratio,
        "p100_gpus": {"aladdin": tot_a100, "jsq_opt": tot_j100},
        "aladdin_over_jsq_top_p100": ours100,
    }
    missed = [p["model"] for p in top if not _gpus(rows, p["model"], p["rate_rps"], "aladdin", "p100_met")]
    s100 = [
        (_gpus(rows, p["model"], p["rate_rps"], "aladdin-search", "gpus_p100"),
         _gpus(rows, p["model"], p["rate_rps"], "jsq-opt", "gpus_p100"))
        for p in top
    ]  # fmt: skip
    search100 = C.ratio(sum(a for a, j in s100 if a and j), sum(j for a, j in s100 if a and j))
    summary["aladdin_search_over_jsq_top_p100"] = search100
    summary["aladdin_missed_p100"] = missed
    return summary


def _headline(rows: list[dict]) -> list[dict]:
    """Per model: JSQ's GPUs at P100 on every seed and each best-fit config's, with its ratio to JSQ
    and whether its answer holds (P100 at n and n + 1 on every seed)."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        jsq = next(r for r in mine if r["config"] == "jsq-opt")
        for r in mine:
            if r["config"].startswith("jsq"):
                continue
            at = r["config"].partition("@")[2]
            base = next((j for j in mine if j["config"] == "jsq-opt" + (f"@{at}" if at else "")), jsq)
            out.append({
                "model": model, "rate_rps": r["rate_rps"], "config": r["config"], "gpus": r.get("gpus"),
                "jsq_gpus": base.get("gpus"), "jsq_workers": base.get("workers"),
                "ratio": C.ratio(r.get("gpus"), base.get("gpus")), "holds": bool(r.get("holds")),
                "jsq_holds": bool(base.get("holds")), "busy_workers": r.get("busy_workers"),
            })  # fmt: skip
    return out


def _goal(s: dict[str, Any]) -> dict[str, Any]:
    head = s["headline"]
    if head:
        return _headline_goal(head)
    tot_a, tot_j = s["top_rate_gpus"]["aladdin"], s["top_rate_gpus"]["jsq_opt"]
    tot_a100, tot_j100 = s["p100_gpus"]["aladdin"], s["p100_gpus"]["jsq_opt"]
    ours, ours100 = s["aladdin_over_jsq_top"], s["aladdin_over_jsq_top_p100"]
    search100, missed = s["aladdin_search_over_jsq_top_p100"], s["aladdin_missed_p100"]
    return {
        "text": "Aladdin ≤ 0.6× the GPUs of JSQ (optimal worker size) at P100 attainment at the top rate (P99 beside)",
        "target": 0.6,
        "ours": ours100,
        "ours_text": f"{C.fmt(ours100)}× at P100 (Σ {tot_a100} opened vs {tot_j100} JSQ GPUs"
        + (f"; Aladdin's opened workers missed P100 for {', '.join(missed)}" if missed else "")
        + f"); P99 {C.fmt(ours)}× (Σ {tot_a} vs {tot_j}); fewest-workers search with least-loaded fallback "
        f"at P100 {C.fmt(search100)}×",
        "met": ours100 is not None and ours100 <= 0.6 and not missed,
    }


def _headline_goal(head: list[dict]) -> dict[str, Any]:
    """Met when, for every model, a goal config (the paper's or the strict constraints, placement at
    arrival) holds P100 on every seed at ≤ 0.6× JSQ's GPUs, JSQ's answer holding too, with JSQ at ≥ 8
    workers (a one-worker difference cannot make the ratio)."""
    parts, met = [], True
    for model in dict.fromkeys(h["model"] for h in head):
        rows = [h for h in head if h["model"] == model and h["config"] in GOAL_CONFIGS]
        if not rows:  # a run of other configs only (``aladdin_headline.py --config``)
            met = False
            parts.append(f"{model}: no goal config run")
            continue
        ok = [
            h for h in rows if h["holds"] and h["jsq_holds"] and h["ratio"] is not None and h["ratio"] <= 0.6
        ]
        met &= bool(ok) and all((h["jsq_workers"] or 0) >= 8 for h in rows)
        parts.append(
            f"{model} at {rows[0]['rate_rps']:g} req/s: "
            + ", ".join(
                f"{h['config']} {h['gpus']} vs JSQ {h['jsq_gpus']} GPUs ({h['jsq_workers']} workers) = "
                f"{C.fmt(h['ratio'])}×{'' if h['holds'] else ' (P100 not held on every seed at n and n+1)'}"
                for h in rows
            )
        )
    return {
        "text": "Aladdin ≤ 0.6× the GPUs of JSQ (optimal worker size) at P100 on every seed, each answer "
        "checked at n − 1 and n + 1 workers, for 7B, 13B and 70B",
        "target": 0.6,
        "ours": max((h["ratio"] or 0.0 for h in head if h["config"] in GOAL_CONFIGS), default=None),
        "ours_text": "; ".join(parts),
        "met": met,
    }


def _ours(s: dict[str, Any]) -> str:
    g = s["top_rate_gpus"]
    tot_a, tot_au, tot_j, tot_v = g["aladdin"], g["aladdin_used"], g["jsq_opt"], g["vllm_default"]
    ours, paper_ratio = s["aladdin_over_jsq_top"], s["paper_n_aladdin_over_jsq_top"]
    return (
        f"at each model's highest rate Aladdin needs {tot_a} GPUs (used {tot_au}) vs JSQ-optimal {tot_j} and "
        f"default vLLM {tot_v}: {C.fmt(ours)}× JSQ, {C.fmt(C.ratio(tot_a, tot_v))}× vLLM; "
        f"with the paper's worker sizes: {C.fmt(paper_ratio)}× JSQ."
    )


def _notes(rows: list[dict], ws: dict[str, Any]) -> list[str]:
    """Why the numbers are what they are (N*, ATGT and prefills, non-monotone attainment, the knobs)."""
    found = [r for r in rows if r.get("workers") is not None and not r.get("same_as")]
    pre = sum(r.get("preemptions") or 0 for r in found)
    v_ttft = sum(r.get("viol_ttft") or 0 for r in found)
    v_atgt = sum(r.get("viol_atgt") or 0 for r in found)
    w7 = model_arch("llama2-7b").weight_bytes / hardware(HW).bandwidth
    notes = [
        "Worker size N* (Eq. 6) with the fitted per-iteration overhead: "
        + ", ".join(
            f"{m} {w['n_star']} (Table 3: {w['paper_n']}; paper M {w['n_paper_memory']}; roofline without "
            f"overhead {w['n_roofline']})"
            for m, w in ws.items()
        )
        + ". The overhead (vLLM 0.2–0.4's per-step CPU work, and the Ray round trip at TP > 1) is what makes "
        "small workers win: without it the roofline splits the weight read N ways for free. The calibrated "
        "cost source charges it to the simulated engines too. At TP 1 a 7B decode step already spends "
        f"{1e3 * w7:.1f} ms of the 15 ms ATGT budget reading weights.",
        "ATGT in the simulator includes the prefill iterations that run between a request's decode steps "
        "(vLLM 0.2–0.4 runs admissible prompts first, as iterations of their own; no chunked prefill), so a "
        "request with a few dozen output tokens misses its ATGT when long prompts are prefilled during its life. Constraint (b) bounds only the decode "
        "context and (d) protects ongoing requests with an iteration clock that ignores those stalls, so "
        "best-fit's packing is optimistic and concentrates exactly the collisions that JSQ's spreading "
        f"avoids. At the reported points {C.fmt(100 * v_atgt / max(1, len(found)), '.2f')}% of requests "
        f"missed ATGT and {C.fmt(100 * v_ttft / max(1, len(found)), '.2f')}% TTFT on average; "
        f"{pre} preemptions in total (KV seldom binds on 80 GB GPUs, which is where best-fit beats JSQ in "
        "the paper's Figure 3).",
        "Attainment is not monotone in the worker count (a different count changes which requests collide), "
        "so the bisection's answer can move by a worker between neighbouring rates; the `tried` lists in "
        "the JSON show every count simulated.",
    ]
    return notes + _knob_notes(rows)


def _knob_notes(rows: list[dict]) -> list[str]:
    """The θ / (d) rows at the top rates, and the configs no worker count brought to 99 %."""
    notes = []
    stuck = [r for r in rows if r.get("workers") is None]
    knobs = [r for r in rows if r["config"].startswith("aladdin θ") or r["config"] == "aladdin no-(d)"]
    if knobs:
        notes.append(
            f"One factor at a time at each model's top rate (θ = {THETA} in the headline rows): "
            + "; ".join(
                f"{r['model']} {r['config']}: opened {r['gpus']} GPUs, P100 {'met' if r['p100_met'] else 'not met'}, "
                f"P99 attainment {C.fmt(r['attainment'], '.4f')}"
                for r in knobs
            )
            + "."
        )
    if stuck:
        notes.append(
            "No worker count reached 99% for: "
            + "; ".join(
                f"{r['model']} {r['rate_rps']:g} req/s {r['config']} (plateau {C.fmt(r['plateau'], '.4f')})"
                for r in stuck
            )
            + " — best-fit leaves the added workers empty once its constraints say the loaded ones suffice."
        )
    return notes
