"""Two runs of one workload compared request by request: ``requests.jsonl`` of ``llmfleet sim
--records`` and of ``llmfleet load --records`` (the same fields), paired by request id.

A report's distributions say *that* a live run's TTFT is longer than the simulator's; the pairs say
whether every request is late by about the same (a fixed cost on the path or in the engines) or a few
by much (a request that another engine served, or that found less of its prompt cached), and which
requests. Per figure the difference B − A of each request served in both: TTFT and latency from the
request's arrival (when it was sent, live), and the engine's own TTFT (a live row's ``engine_ttft_s``,
from the engine's receipt; a simulated row's from its ``dispatched_s``: its arrival, or the end of its
hold in the scheduler; its TTFT when the row has no dispatch time). The prompt tokens found cached are compared too: the share of pairs in which both
found the same, and the engines' TTFT difference of those pairs apart from the others.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

QUANTILES = (1, 10, 50, 90, 99)
FIGURES = ("ttft_s", "engine_ttft_s", "latency_s")


@dataclass(frozen=True)
class Timed:
    """One served request's figures (seconds; None: not known) and its prompt tokens found cached."""

    ttft_s: float | None
    engine_ttft_s: float | None
    latency_s: float | None
    cached_tokens: int | None


def timed(row: Mapping[str, object]) -> Timed | None:
    """A ``requests.jsonl`` row's figures; None for a request that was not served."""
    arrival, first, finish = row.get("arrival_s"), row.get("first_token_s"), row.get("finish_s")
    if row.get("failed") or not isinstance(arrival, int | float) or not isinstance(finish, int | float):
        return None
    ttft = first - arrival if isinstance(first, int | float) else None
    sent = row.get("dispatched_s")
    if "engine_ttft_s" in row:  # a live row: from the engine's receipt
        engine = row["engine_ttft_s"]
    elif isinstance(sent, int | float) and isinstance(first, int | float):  # simulated: from its dispatch
        engine = first - sent
    else:
        engine = ttft
    cached = row.get("cached_tokens")
    return Timed(
        ttft,
        float(engine) if isinstance(engine, int | float) else None,
        finish - arrival,
        int(cached) if isinstance(cached, int) else None,
    )


def read_rows(path: Path, policy: str | None = None) -> dict[str, Timed]:
    """The served requests of a ``requests.jsonl`` by id; of the run ``policy`` when its rows name
    their run (``llmfleet sim --compare`` writes several runs to one file). ValueError naming the line
    of a row that is not JSON or has no request id."""
    out: dict[str, Timed] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not JSON: {e}") from None
        if not isinstance(row, dict) or not isinstance(row.get("request_id"), str):
            raise ValueError(f"{path}:{n}: a row needs a request_id")
        if policy is not None and row.get("policy", policy) != policy:
            continue
        t = timed(row)
        if t is not None:
            out[row["request_id"]] = t
    return out


def spread(values: list[float]) -> dict[str, float]:
    """n, mean and the quantiles of ``values`` (n = 0 and nothing else when empty)."""
    if not values:
        return {"n": 0}
    a = np.asarray(values, dtype=float)
    return {
        "n": int(a.size),
        "mean": float(a.mean()),
        **{f"p{q}": float(v) for q, v in zip(QUANTILES, np.percentile(a, QUANTILES), strict=True)},
    }


@dataclass(frozen=True)
class Pairing:
    """Requests served in both runs (``paired``) and in one only; per figure the spread of B − A over
    the pairs that know it; the share of pairs (both told) that found the same prompt tokens cached;
    and the engines' TTFT difference over those pairs and over the others."""

    paired: int
    only_a: int
    only_b: int
    diffs: dict[str, dict[str, float]]
    same_cached_share: float | None
    engine_ttft_same_cached: dict[str, float]
    engine_ttft_other_cached: dict[str, float]


def pair(a: Mapping[str, Timed], b: Mapping[str, Timed]) -> Pairing:
    both = sorted(a.keys() & b.keys())
    diffs = {}
    for f in FIGURES:
        values = [(getattr(a[k], f), getattr(b[k], f)) for k in both]
        diffs[f] = spread([y - x for x, y in values if x is not None and y is not None])
    told = [k for k in both if a[k].cached_tokens is not None and b[k].cached_tokens is not None]
    same = {k for k in told if a[k].cached_tokens == b[k].cached_tokens}

    def engine(keys: list[str]) -> dict[str, float]:
        pairs = [(a[k].engine_ttft_s, b[k].engine_ttft_s) for k in keys]
        return spread([y - x for x, y in pairs if x is not None and y is not None])

    return Pairing(
        paired=len(both),
        only_a=len(a.keys() - b.keys()),
        only_b=len(b.keys() - a.keys()),
        diffs=diffs,
        same_cached_share=len(same) / len(told) if told else None,
        engine_ttft_same_cached=engine([k for k in told if k in same]),
        engine_ttft_other_cached=engine([k for k in told if k not in same]),
    )


def _ms(d: Mapping[str, float], key: str) -> str:
    return f"{1e3 * d[key]:+.1f}" if d.get("n") else "–"


def markdown(p: Pairing, a_name: str, b_name: str) -> str:
    """The pairing as a markdown section (differences B − A in ms)."""
    cols = ("mean", *(f"p{q}" for q in QUANTILES))
    lines = [
        f"## Per request: {b_name} − {a_name}",
        "",
        f"{p.paired} requests served in both ({p.only_a} in A only, {p.only_b} in B only); differences in ms.",
        "",
        "| figure | pairs | " + " | ".join(cols) + " |",
        "|---|---:|" + "---:|" * len(cols),
    ]
    rows = [
        ("TTFT", p.diffs["ttft_s"]),
        ("engines' TTFT", p.diffs["engine_ttft_s"]),
        ("latency", p.diffs["latency_s"]),
        ("engines' TTFT, same prompt tokens cached", p.engine_ttft_same_cached),
        ("engines' TTFT, other prompt tokens cached", p.engine_ttft_other_cached),
    ]
    for name, d in rows:
        lines.append(f"| {name} | {d.get('n', 0)} | " + " | ".join(_ms(d, c) for c in cols) + " |")
    share = p.same_cached_share
    lines += [
        "",
        f"Same prompt tokens found cached: {'–' if share is None else f'{share:.1%}'} of the pairs.",
    ]
    return "\n".join(lines) + "\n"
