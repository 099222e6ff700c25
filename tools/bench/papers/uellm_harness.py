"""UELLM's headline as the authors' public scripts measure it (the "authors' harness"), for ``papers/uellm.py``.

The scripts (github.com/HYIUYOU/UELLM, ``UELM/UELM-all/all.py`` for UELLM, ``UELM/S3/s3.py`` for S³,
both on ChatGLM2-6B through its ``chat_batch``), read:

- 100 requests (``ar = 100``, the first 100 of the data file), all present at the start; each script
  prints the total elapsed time of serving them, batch after batch, and the share that missed its SLO.
- UELLM (``all.py``): one GPU (``load_model_on_gpus(..., num_gpus=1)``); requests sorted by
  ``1·SLO + 0.5·output`` (``output`` = the label length); a request joins the current batch while the
  batch has fewer than 10 and ``(output − current_max)·(n + 1)·1.2 ≤ 15000``; each batch calls
  ``chat_batch(..., max_length = max label in the batch + 50)``.
- S³ (``s3.py``): four GPUs (``num_gpus=4``); requests sorted by label; a request joins while the batch
  has fewer than 20 and the labels' sum stays ≤ 1024; each batch calls ``chat_batch`` with its defaults:
  ``max_length = 2048``, ``do_sample=True``, ``top_p = 0.7``, ``temperature = 0.95``.
- ``max_length`` in transformers counts the (left-padded) prompt and the generated tokens; a static
  batch runs until every row has stopped (EOS or ``max_length``), finished rows computing padding.

So UELLM's batches are cut at their longest label + 50 tokens, S³'s only at 2,048. How long a row runs
under sampling is not in the scripts: it is ChatGLM2's own sampled length, which the labels only
estimate. Here each row generates ``factor × its label`` tokens (within the batch's cap), for the
factors in :data:`FACTORS`, and ``"cap"`` (no row stops before its batch's cap: the longest S³ can run).
Both systems sample, so the factor applies to both; only UELLM's cap binds it. The Morphling-like
baseline's script is not public: it runs FIFO batches of its stress-tested size on its deployment with
``chat_batch``'s defaults, like S³, after its stress tests (the paper counts them, §5.3; ``Morphling-noprof``
without them). ``S3-uellm-cap`` is S³ with UELLM's cap (label + 50): one factor,
the cap, changed.

Costs: the selected cost source for each deployment (``common.cost_book``) plus the pipeline overheads of
``costmodel.pipeline.HF_PIPELINE_OVERHEAD`` (per iteration and per stage boundary; assumptions stated
there), through ``costmodel.pipeline.static_batch_time``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from llmfleet.costmodel import model_arch
from llmfleet.costmodel.pipeline import HF_PIPELINE_OVERHEAD, NO_OVERHEAD, PipelineOverhead, static_batch_time

from . import common as C
from . import uellm_cluster as U

REQUESTS = 100  # ar = 100
UELLM_BATCH, UELLM_THRESHOLD, UELLM_L2 = 10, 15000.0, 1.2
UELLM_SORT = (1.0, 0.5)  # a·SLO + b·output
UELLM_SLACK = 50  # max_length = the batch's longest label + 50
S3_BATCH, S3_THRESHOLD = 20, 1024  # fewer than 20 per batch, labels' sum ≤ 1024
MAX_LENGTH = 2048  # chat_batch's default max_length
FACTORS: tuple[float | str, ...] = (1.0, 2.0, 4.0, "cap")
GOAL = 0.7


@dataclass(frozen=True)
class Query:
    """One request of the harness: prompt tokens, label output length, SLO (s)."""

    prompt: int
    label: int
    slo: float


def queries(lengths: np.ndarray, slos: Sequence[float], seed: int) -> list[Query]:
    """The first :data:`REQUESTS` (prompt, output) pairs, each with an SLO drawn from ``slos``."""
    rng = np.random.default_rng(seed)
    pick = rng.choice(np.asarray(slos, dtype=float), size=REQUESTS)
    return [Query(int(p), int(o), float(s)) for (p, o), s in zip(lengths[:REQUESTS], pick, strict=True)]


def uellm_groups(qs: Sequence[Query]) -> list[list[Query]]:
    """``all.py``'s grouping (see the module docstring), including its unclamped difference."""
    a, b = UELLM_SORT
    order = sorted(qs, key=lambda q: a * q.slo + b * q.label)
    groups: list[list[Query]] = []
    cur: list[Query] = []
    top = order[0].label
    for q in order:
        if len(cur) < UELLM_BATCH and (q.label - top) * (len(cur) + 1) * UELLM_L2 <= UELLM_THRESHOLD:
            cur.append(q)
            top = max(top, q.label)
        else:
            groups.append(cur)
            cur, top = [q], q.label
    if cur:
        groups.append(cur)
    return [g for g in groups if g]


def s3_groups(qs: Sequence[Query]) -> list[list[Query]]:
    """``s3.py``'s grouping: by label, fewer than 20 a batch, labels' sum ≤ 1024."""
    groups: list[list[Query]] = []
    cur: list[Query] = []
    total = 0
    for q in sorted(qs, key=lambda q: q.label):
        if len(cur) < S3_BATCH and q.label + total <= S3_THRESHOLD:
            cur.append(q)
            total += q.label
        else:
            groups.append(cur)
            cur, total = [q], q.label
    if cur:
        groups.append(cur)
    return [g for g in groups if g]


def fifo_groups(qs: Sequence[Query], batch: int) -> list[list[Query]]:
    return [list(qs[i : i + batch]) for i in range(0, len(qs), batch)]


def steps(group: Sequence[Query], factor: float | str, cap: int) -> int:
    """Tokens the batch generates: its longest row's, each row ``factor × label`` (or the cap), all within
    ``cap`` (the batch's ``max_length`` minus its padded prompt; at least one token, as transformers)."""
    room = max(1, cap - max(q.prompt for q in group))
    if factor == "cap":
        return room
    return min(room, max(1, max(math.ceil(float(factor) * q.label) for q in group)))


def uellm_cap(group: Sequence[Query]) -> int:
    return max(q.label for q in group) + UELLM_SLACK


def serve(
    groups: Sequence[Sequence[Query]],
    dep: U.Deployment,
    model: str,
    factor: float | str,
    cap: Callable[[Sequence[Query]], int],
    overhead: PipelineOverhead = HF_PIPELINE_OVERHEAD,
    start_s: float = 0.0,
) -> dict:
    """The batches one after the other on ``dep`` from ``start_s`` (Morphling's stress tests come first):
    total elapsed time, mean latency (every request arrives at 0 and finishes with its batch), SLO misses
    (the scripts' "Default Rate")."""
    cost = C.cost_book(dep.hw, {model: model_arch(model)}).model(model, 1)
    t, finish, missed = start_s, [], 0
    for g in groups:
        t += static_batch_time(
            cost, [q.prompt for q in g], steps(g, factor, cap(g)), overhead, len(dep.stages)
        )
        finish += [t] * len(g)
        missed += sum(q.slo < t for q in g)
    return {
        "elapsed_s": t,
        "latency_mean_s": float(np.mean(finish)),
        "slo_violation": missed / len(finish),
        "batches": len(groups),
        "cost_source": cost.source,
    }


def run(deps: dict, model: str, lengths: np.ndarray, slos: Sequence[float], seed: int) -> dict:
    """Every system at every factor, UELLM's cuts (on the scripts' total elapsed time and on mean latency),
    and the smallest factor (1 to 8, by 0.25) at which its elapsed-time cut reaches :data:`GOAL` against
    both S³ and Morphling (the break-even; None if none)."""
    qs = queries(lengths, slos, seed)
    mor = deps["morphling"]
    systems: dict[str, Callable[[float | str], dict]] = {
        "UA": lambda f: serve(uellm_groups(qs), deps["helr"], model, f, uellm_cap),
        "S3": lambda f: serve(s3_groups(qs), deps["default"], model, f, lambda g: MAX_LENGTH),
        "S3-uellm-cap": lambda f: serve(s3_groups(qs), deps["default"], model, f, uellm_cap),
        "Morphling": lambda f: serve(
            fifo_groups(qs, mor.batch), mor.deployment, model, f, lambda g: MAX_LENGTH, start_s=mor.profile_s
        ),
        "Morphling-noprof": lambda f: serve(
            fifo_groups(qs, mor.batch), mor.deployment, model, f, lambda g: MAX_LENGTH
        ),
    }
    rows = []
    for f in FACTORS:
        res = {name: fn(f) for name, fn in systems.items()}
        ua = res["UA"]
        for name, r in res.items():
            rows.append({
                "factor": f, "system": name, **r,
                "cut_elapsed": 1 - ua["elapsed_s"] / r["elapsed_s"],
                "cut_latency": 1 - ua["latency_mean_s"] / r["latency_mean_s"],
            })  # fmt: skip
    grid = [1.0 + 0.25 * i for i in range(29)]  # 1 … 8

    def worst_cut(f: float) -> float:
        ua = systems["UA"](f)["elapsed_s"]
        return min(1 - ua / systems[b](f)["elapsed_s"] for b in ("S3", "Morphling"))

    even = next((f for f in grid if worst_cut(f) >= GOAL), None)
    bare = {  # one factor: the same runs without the pipeline overheads
        str(f): {
            "UA": serve(uellm_groups(qs), deps["helr"], model, f, uellm_cap, NO_OVERHEAD)["elapsed_s"],
            "S3": serve(s3_groups(qs), deps["default"], model, f, lambda g: MAX_LENGTH, NO_OVERHEAD)[
                "elapsed_s"
            ],
        }
        for f in (1.0, "cap")
    }
    return {
        "requests": len(qs),
        "rows": rows,
        "break_even_factor": even,
        "no_overhead": bare,
        "groups": {
            "UA": len(uellm_groups(qs)),
            "S3": len(s3_groups(qs)),
            "Morphling": len(fifo_groups(qs, mor.batch)),
        },
        "overhead": {
            "per_iteration_s": HF_PIPELINE_OVERHEAD.per_iteration_s,
            "per_stage_s": HF_PIPELINE_OVERHEAD.per_stage_s,
        },
    }
