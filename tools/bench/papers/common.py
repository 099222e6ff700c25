"""Shared pieces of the paper scenarios: data paths, workloads, predictors, metric rows, tables, plots."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from llmfleet.costmodel import Hardware, ModelArch
from llmfleet.predict import EmpiricalLengthPredictor, LengthQuery
from llmfleet.sim import run as sim_run
from llmfleet.sim.cost import COST_SOURCES, DEFAULT_COST_SOURCE, CostBook
from llmfleet.sim.run import Experiment
from llmfleet.sim.spec import SimSpec
from llmfleet.workload import (
    SHAREGPT_VLLM,
    Workload,
    WorkloadRequest,
    alpaca_lengths,
    load_azure_trace,
    poisson,
    sharegpt_like_lengths,
)

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO.parent / "shared"
TRACE = SHARED / "traces" / "azure_llm_2023_conv.csv"
ALPACA = SHARED / "datasets" / "alpaca_4000.json"

COST_NOTE = (
    "Latencies come from the simulator's roofline cost models (catalog hardware × catalog model: "
    "max(compute, memory) + all-reduce per iteration, `llmfleet.costmodel.roofline`); they are NOT fitted "
    "on GPUs (no GPU was used), so absolute numbers are those of an idealised engine without kernel-launch "
    "or framework overheads."
)
# the simulator's default cost source unless run.py --cost-source sets another
COST_SOURCE: str = DEFAULT_COST_SOURCE
SHORT_ALPACA: Path | None = None  # set by run.py --alpaca: Alpaca lengths instead of ShareGPT-like ones


Log = Callable[[str], None]  # a scenario's progress lines


def worker_log(msg: str) -> None:
    """A progress line from one of run.py's worker processes: stderr, flushed, with the worker's pid."""
    print(f"[pid {os.getpid()}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ costs
def set_cost_source(name: str) -> None:
    """Select the simulator's cost source for every scenario (``--cost-source``): ``SimSpec.cost_source``
    for the simulations and ``CostBook.build(..., source=)`` for the bench's own solo times."""
    global COST_SOURCE
    if name not in COST_SOURCES:
        raise ValueError(f"unknown cost source {name!r}; valid: {list(COST_SOURCES)}")
    COST_SOURCE = name


def cost_note() -> str:
    if COST_SOURCE == "roofline":
        return COST_NOTE
    if COST_SOURCE == "calibrated":
        return (
            "Latencies come from the simulator's `calibrated` cost source (`llmfleet.costmodel.calibrated`: "
            "Vidur's measured A100/H100 operator times plus the per-iteration CPU overhead a + c·b fitted "
            "per TP on Vidur's vLLM profile; elsewhere the roofline scaled by fitted factors; the per-"
            "instance sources are in each row's JSON under `cost_models`)."
        )
    return (
        f"Latencies come from the simulator's `{COST_SOURCE}` cost source (`llmfleet.sim.cost`: measured "
        "per-operator times where the data covers the model and GPU, the roofline elsewhere; the per-"
        "instance sources are in each row's JSON under `cost_models`)."
    )


def cost_label() -> str:
    """The cost source as the tables state it."""
    return "roofline (not GPU-fitted)" if COST_SOURCE == "roofline" else f"{COST_SOURCE} (sim.cost)"


def cost_book(hw: Hardware, archs: Mapping[str, ModelArch]) -> CostBook:
    """The bench's own CostBook (solo times), from the selected cost source."""
    return CostBook.build(hw, archs, source=COST_SOURCE)


def simulate(spec: SimSpec, *args: Any, **kwargs: Any) -> Experiment:
    """``llmfleet.sim.run.simulate`` with the selected cost source."""
    return sim_run.simulate(dataclasses.replace(spec, cost_source=COST_SOURCE), *args, **kwargs)


# ----------------------------------------------------------------------------------------- workloads
def conv_trace(path: str | None = None) -> Workload:
    """The Azure LLM conversation trace (19,366 requests over ~58 min, ~5.5 req/s); ``TRACE`` is read
    at call time so a test can point it at a small synthetic trace."""
    return _load_trace(path or str(TRACE))


@lru_cache(maxsize=2)
def _load_trace(path: str) -> Workload:
    return load_azure_trace(path, service="chat")


def trace_lengths(max_prompt: int | None = None, max_output: int | None = None) -> np.ndarray:
    """(prompt, output) pairs of the conv trace, each truncated to its cap (None = no cap)."""
    a = np.array(conv_trace().lengths(), dtype=np.int64)
    if max_prompt is not None:
        a[:, 0] = np.minimum(a[:, 0], max_prompt)
    if max_output is not None:
        a[:, 1] = np.minimum(a[:, 1], max_output)
    return a


def short_prompt_lengths(n: int, *, seed: int, max_prompt: int, max_output: int) -> tuple[np.ndarray, str]:
    """ShareGPT-like (prompt, output) pairs for the Aladdin and SCLS scenarios, and a label saying which.

    By default ``n`` pairs synthesized from the published ShareGPT means (vLLM paper §6.1: input 161.31,
    output 337.99 tokens; log-normal shape σ = 1, an assumption, see ``llmfleet.workload.paperlike``);
    with ``--alpaca PATH`` (``SHORT_ALPACA``) the Alpaca items' lengths (approximate token counts, all of
    them, ``n`` ignored). Both are clipped to the caps."""
    if SHORT_ALPACA is not None:
        a = np.array(alpaca_lengths(SHORT_ALPACA), dtype=np.int64)
        a[:, 0] = np.clip(a[:, 0], 1, max_prompt)
        a[:, 1] = np.clip(a[:, 1], 1, max_output)
        label = f"Alpaca lengths ({SHORT_ALPACA.name}, {len(a)} items, approximate token counts)"
    else:
        a = sharegpt_like_lengths(n, seed=seed, max_prompt=max_prompt, max_output=max_output)
        label = (
            f"ShareGPT-like synthetic lengths (log-normal, σ = 1, published means "
            f"{SHAREGPT_VLLM.mean_prompt:g}/{SHAREGPT_VLLM.mean_output:g} from the vLLM paper §6.1)"
        )
    return a, f"{label}; realized mean in/out {a[:, 0].mean():.0f}/{a[:, 1].mean():.0f} tok"


def split(lengths: np.ndarray, train: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A seeded disjoint (train, test) split of length samples: the predictor never sees test requests."""
    perm = np.random.default_rng(seed).permutation(len(lengths))
    return lengths[perm[:train]], lengths[perm[train:]]


def poisson_workload(
    lengths: np.ndarray,
    rate: float,
    duration_s: float,
    *,
    seed: int,
    service: str | Sequence[str] = "chat",
    model: str = "",
) -> Workload:
    """Poisson(rate) arrivals in [0, duration_s), lengths drawn with replacement from ``lengths``; with a
    list of services each request gets one uniformly at random (seeded)."""
    times = poisson(rate, duration_s=duration_s, seed=seed)
    rng = np.random.default_rng(seed + 7919)
    pick = rng.integers(0, len(lengths), len(times))
    names = [service] if isinstance(service, str) else list(service)
    which = rng.integers(0, len(names), len(times))
    reqs = [
        WorkloadRequest(f"r{i}", float(t), int(lengths[j][0]), int(lengths[j][1]), names[k], model)
        for i, (t, j, k) in enumerate(zip(times.tolist(), pick.tolist(), which.tolist(), strict=True))
    ]
    return Workload(tuple(reqs))


def rescaled(workload: Workload, scale: float, horizon_s: float) -> Workload:
    """Trace arrivals in [0, horizon_s·scale) of trace time, replayed ``scale`` times faster (so the
    simulated arrivals span ``horizon_s``); labels and lengths are kept."""
    end = horizon_s * scale
    return Workload(
        tuple(
            dataclasses.replace(r, arrival_s=r.arrival_s / scale)
            for r in workload.requests
            if r.arrival_s < end
        )
    )


# ---------------------------------------------------------------------------------------- predictors
class SequencePredictor:
    """The simulator's ``predict(service, prompt_tokens)`` answering a precomputed value per request.

    The simulator asks once per request, in the workload's arrival order, so the i-th call is the i-th
    request; the prompt length is checked so a mismatch fails loudly instead of mis-attributing values.
    Used for the noisy-oracle predictions (a stand-in for a fine-tuned length classifier)."""

    def __init__(self, workload: Workload, values: Sequence[float]) -> None:
        if len(values) != len(workload):
            raise ValueError(f"{len(values)} predictions for {len(workload)} requests")
        self._items = [(r.prompt_tokens, float(v)) for r, v in zip(workload.requests, values, strict=True)]
        self._i = 0

    def __call__(self, service: str, prompt_tokens: int) -> float:
        if self._i >= len(self._items):
            raise RuntimeError("more predictions asked than requests in the workload")
        p, v = self._items[self._i]
        if p != prompt_tokens:
            raise RuntimeError(f"prediction #{self._i}: expected a {p}-token prompt, got {prompt_tokens}")
        self._i += 1
        return v


def noisy_oracle(workload: Workload, sigma: float, seed: int) -> list[float]:
    """True output length × exp(N(0, σ²)) per request (seeded), at least 1 token."""
    rng = np.random.default_rng(seed)
    noise = np.exp(rng.normal(0.0, sigma, len(workload)))
    return [max(1.0, r.output_tokens * f) for r, f in zip(workload.requests, noise, strict=True)]


def empirical_predictor(
    train: np.ndarray, service: str = "chat"
) -> tuple[EmpiricalLengthPredictor, Callable]:
    """Aladdin's predictor (output-length distribution per input-length bin) fitted on ``train``, and the
    simulator's ``predict`` callable over it (memoised per input bin: the answer depends only on the bin)."""
    pred = EmpiricalLengthPredictor(seed=0)
    for p, o in train.tolist():
        pred.observe(LengthQuery(service, prompt_tokens=int(p)), int(o))
    memo: dict[tuple[str, int], float] = {}

    def predict(svc: str, prompt_tokens: int) -> float:
        key = (svc, pred.bin_of(prompt_tokens))
        v = memo.get(key)
        if v is None:
            v = memo[key] = float(pred.predict(LengthQuery(svc, prompt_tokens=prompt_tokens)).mean)
        return v

    return pred, predict


# ------------------------------------------------------------------------------------------- metrics
def metrics(e: Experiment) -> dict[str, Any]:
    """The numbers every table draws from (seconds unless named otherwise)."""
    o, c = e.report["overall"], e.report["cluster"]
    used = {k: str(v) for k, v in (e.report.get("cost_models") or {}).items()}
    return {
        "requests": o["requests"],
        "completed": o["completed"],
        "failed": o["failed"],
        "latency_mean_s": o["latency_s"]["mean"],
        "latency_p95_s": _pct([r.latency_s for r in e.result.records if r.done], 95),
        "latency_p99_s": o["latency_s"]["p99"],
        "ttft_mean_s": o["ttft_s"]["mean"],
        "tpot_mean_ms": 1e3 * o["tpot_s"]["mean"],
        "norm_latency_mean": o["normalized_latency"]["mean"],
        "norm_latency_p99": o["normalized_latency"]["p99"],
        "slo_seallm": o["slo"].get("seallm"),
        "slo_aladdin": o["slo"].get("aladdin"),
        "slo_uellm": o["slo"].get("uellm"),
        "throughput_rps": c["throughput_rps"],
        "throughput_tokens_per_s": c["throughput_tokens_per_s"],
        "makespan_s": c["makespan_s"],
        "preemptions": o["preemptions"],
        "instances": c["instances"],
        "gpus": c["provisioned_gpus"],
        "sim_wall_s": e.result.wall_s,
        # the sources actually used (a vidur request falls back to the roofline where no data covers it)
        "cost_source": "/".join(sorted(set(used.values()))) or COST_SOURCE,
        "cost_models": used,
    }


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else 0.0


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when undefined."""
    if a is None or b is None or b == 0 or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return a / b


# -------------------------------------------------------------------------------------------- tables
def fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "∞" if v > 0 else "–"
        if spec:
            return format(v, spec)
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-2):
            return f"{v:.3g}"
        return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def md_table(rows: Iterable[dict], columns: Sequence[tuple[str, str, str]]) -> str:
    """Rows as a markdown table; ``columns`` = (header, key, format spec or "")."""
    rows = list(rows)
    out = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(fmt(r.get(k), f) for _, k, f in columns) + " |")
    return "\n".join(out)


def goal_line(goal: dict) -> str:
    verdict = "**met**" if goal.get("met") else "**not met**"
    return f"Goal: {goal['text']} — ours: {goal['ours_text']} → {verdict}."


def section(result: dict, table: str, extra: Sequence[str] = ()) -> str:
    """The markdown section of one paper: setup, table, claim vs ours, goal, notes."""
    lines = [f"## {result['title']}", ""]
    lines += [f"- {k}: {v}" for k, v in result["setup"].items()]
    lines += ["", table, ""]
    lines += list(extra)
    lines += [
        "",
        f"Paper's claim: {result['claim']}",
        "",
        f"Ours: {result['ours']}",
        "",
        goal_line(result["goal"]),
    ]
    if result.get("notes"):
        lines += ["", "Notes and why we differ:", ""]
        lines += [f"- {n}" for n in result["notes"]]
    lines += ["", f"(scenario wall time {result['wall_s']:.0f} s)", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- plots
def plot_sweep(
    rows: Sequence[dict],
    panels: Sequence[tuple[str, str, bool]],
    path: Path,
    title: str,
    *,
    x: str = "rate_rps",
    xlabel: str = "arrival rate (req/s)",
    series: str = "policy",
) -> Path:
    """One panel per (metric key, y label, log y); one line per ``series`` value over ``x``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r[series] for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (key, label, logy) in zip(axes[0], panels, strict=True):
        for n in names:
            pts = sorted((r[x], r[key]) for r in rows if r[series] == n and r.get(key) is not None)
            pts = [(a, b) for a, b in pts if math.isfinite(b)]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=n)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
